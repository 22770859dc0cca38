// PeerAlive (node/cluster/control_channel.h): a peer process on this host is alive until it
// exits — a zombie not yet reaped counts as gone, as a killed rank does until mpirun reaps
// it — through the pidfd and through the /proc fallback alike; peers elsewhere are unknown
// (alive).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "node/cluster/control_channel.h"

namespace specnode {
namespace {

// A child that waits to be killed.
pid_t Child() {
  const pid_t pid = fork();
  if (pid == 0) {
    while (true) pause();
  }
  return pid;
}

// Polls `alive` for up to 5 s until it says gone.
template <typename Alive>
bool GoneWithin5s(Alive alive) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    if (!alive()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(PeerAliveTest, AliveUntilItExitsThenGoneAsAZombieAndAfterTheReap) {
  const pid_t pid = Child();
  ASSERT_GT(pid, 0);
  const std::string here = ThisHost();
  EXPECT_TRUE(PeerAlive(pid, here));
  EXPECT_TRUE(PeerAliveByProc(pid));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // Not reaped yet: a zombie.
  EXPECT_TRUE(GoneWithin5s([&] { return PeerAlive(pid, here); }));
  EXPECT_TRUE(GoneWithin5s([&] { return PeerAliveByProc(pid); }));
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_FALSE(PeerAlive(pid, here));
  EXPECT_FALSE(PeerAliveByProc(pid));
}

TEST(PeerAliveTest, APidFirstAskedAboutAfterItWasReapedIsGone) {
  const pid_t pid = Child();
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_FALSE(PeerAlive(pid, ThisHost()));
}

TEST(PeerAliveTest, UnknownHostsAndPidsCountAsAlive) {
  EXPECT_TRUE(PeerAlive(getpid(), ThisHost()));
  EXPECT_TRUE(PeerAlive(getpid(), ThisHost() + "-elsewhere"));
  EXPECT_TRUE(PeerAlive(0, ThisHost()));
  EXPECT_TRUE(PeerAlive(getpid(), ""));
}

}  // namespace
}  // namespace specnode
