// The host's memory as the CPU device's (runtime/host_memory.h): /proc/meminfo's figures,
// a cgroup v2 limit below them taking over, and the live reading being sane.
#include "runtime/host_memory.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace specnode {
namespace {

constexpr char kMemInfo[] =
    "MemTotal:       16384000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:   12288000 kB\n"
    "Buffers:          100000 kB\n";

TEST(HostMemoryTest, MemInfoGivesTotalAndUsed) {
  auto m = ParseHostMemory(kMemInfo, std::nullopt, std::nullopt);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total_bytes, int64_t{16384000} * 1024);
  EXPECT_EQ(m->used_bytes, int64_t{16384000 - 12288000} * 1024);
  // "max" (no limit) and a limit above MemTotal change nothing.
  auto unlimited = ParseHostMemory(kMemInfo, "max\n", "123\n");
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->total_bytes, m->total_bytes);
  EXPECT_EQ(unlimited->used_bytes, m->used_bytes);
  auto above = ParseHostMemory(kMemInfo, std::to_string(int64_t{1} << 50), "123");
  ASSERT_TRUE(above.ok());
  EXPECT_EQ(above->total_bytes, m->total_bytes);
}

TEST(HostMemoryTest, ACgroupLimitIsTheTotalAndItsUseTheUsed) {
  auto m = ParseHostMemory(kMemInfo, "4294967296\n", "1073741824\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total_bytes, int64_t{4} << 30);
  EXPECT_EQ(m->used_bytes, int64_t{1} << 30);
}

TEST(HostMemoryTest, MissingLinesAreInvalidArgument) {
  EXPECT_EQ(ParseHostMemory("MemTotal: 10 kB\n", std::nullopt, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHostMemory("", std::nullopt, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(
      ParseHostMemory("MemTotal: x kB\nMemAvailable: 1 kB\n", std::nullopt, std::nullopt).ok());
}

TEST(HostMemoryTest, TheLiveReadingIsSane) {
  auto m = HostMemory();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->total_bytes, int64_t{64} << 20);
  EXPECT_GT(m->used_bytes, 0);  // this process, at least
  EXPECT_LE(m->used_bytes, m->total_bytes);
}

}  // namespace
}  // namespace specnode
