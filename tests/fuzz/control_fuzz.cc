// libFuzzer target for the coordinator <-> shard control protocol
// (node/cluster/control_protocol.h, docs/control-protocol.md): frames through
// PeekControlKind and every decoder.
//
// Input layout: byte 0 selects the mode. With its top bit clear, its low 3 bits name the
// kind and the harness writes a valid header (magic, this build's version, kind, payload
// length) in front of the remaining bytes, so the fuzzer spends its time in the payload
// decoders; with the top bit set the remaining bytes are the whole frame, header included
// (magic, version and length checks).
//
// Beyond "no crash, no sanitizer report, no huge allocation" (-rss_limit_mb) it traps when
// a promise breaks: a frame a decoder accepts re-encodes to a frame that decodes again and
// encodes to the same bytes (decode and encode agree on the format), and PeekControlKind
// names the kind of every frame a decoder accepts.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "node/cluster/control_protocol.h"

namespace {

using specnode::ControlKind;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only, as the protocol is
  out->append(b, sizeof(T));
}

std::string Framed(uint16_t kind, std::string_view payload) {
  std::string f;
  Put<uint32_t>(&f, specnode::kControlMagic);
  Put<uint16_t>(&f, specnode::kControlProtocolVersion);
  Put<uint16_t>(&f, kind);
  Put<uint64_t>(&f, payload.size());
  f.append(payload);
  return f;
}

// decode(frame) ok => encode(m) decodes, and encodes to the same bytes again.
template <typename Decode>
void RoundTrip(std::string_view frame, ControlKind kind, Decode decode) {
  auto m = decode(frame);
  if (!m.ok()) return;
  auto peek = specnode::PeekControlKind(frame);
  Check(peek.ok() && *peek == kind);
  const std::string once = specnode::EncodeControl(*m);
  auto again = decode(once);
  Check(again.ok());
  Check(specnode::EncodeControl(*again) == once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string frame = (data[0] & 0x80) ? std::string(rest) : Framed(data[0] & 7, rest);

  (void)specnode::PeekControlKind(frame);
  RoundTrip(frame, ControlKind::kHello, specnode::DecodeHello);
  RoundTrip(frame, ControlKind::kHelloAck, specnode::DecodeHelloAck);
  RoundTrip(frame, ControlKind::kStepPlan, specnode::DecodeStepPlan);
  RoundTrip(frame, ControlKind::kStepReply, specnode::DecodeStepReply);
  RoundTrip(frame, ControlKind::kShutdown, specnode::DecodeShutdown);
  return 0;
}
