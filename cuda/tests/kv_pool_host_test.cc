// The GPU page pool's host-compiled parts, checked without a GPU (these run everywhere):
// - kv_row_codec.h, the row code the kernels run, byte for byte against the CPU pool's
//   KvEncodeRow / KvDecodeRow / HadamardInPlace and model/gguf's f16 conversions;
// - the slab allocator that places pages of three sizes in the device arena;
// - the pass tables the kernels read and the mass reduction back into the manager's rows;
// - the attention's chunking (kv_attention_chunks.h): every position in exactly one chunk,
//   and the merge of chunk partials equal to one softmax over all of them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "cuda/kv_attention_chunks.h"
#include "cuda/kv_frame_allocator.h"
#include "cuda/kv_pass_tables.h"
#include "gtest/gtest.h"
#include "kvstore/kv_precision.h"
#include "kvstore/kv_row_codec.h"
#include "model/gguf/ggml_types.h"

namespace specnode {
namespace {

namespace codec = kv_codec;

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(KvRowCodec, HalfConversionsMatchTheHostOnes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = Fp16ToFp32(static_cast<uint16_t>(h));
    const float got = codec::HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(codec::FloatBits(got), codec::FloatBits(want)) << h;
    }
  }
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               65504.0f,
                               65519.99f,
                               65520.0f,
                               65536.0f,
                               1e30f,
                               -1e30f,
                               INFINITY,
                               -INFINITY,
                               6.103515625e-05f,  // smallest normal half
                               5.9604644775390625e-08f,
                               2.98023223876953125e-08f,  // 2^-24, 2^-25
                               2.9802326e-08f,
                               8.9406967e-08f,
                               1e-45f};
  std::mt19937 gen(1);
  for (int i = 0; i < 200000; ++i) values.push_back(FromBits(static_cast<uint32_t>(gen())));
  // Every half and the midpoints between neighbours (the ties).
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float a = Fp16ToFp32(static_cast<uint16_t>(h));
    const float b = Fp16ToFp32(static_cast<uint16_t>(h + 1));
    values.push_back(a);
    values.push_back(-a);
    values.push_back(0.5f * (a + b));
  }
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(codec::HalfToFloat(codec::FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(codec::FloatToHalf(f), Fp32ToFp16(f)) << f << " bits " << codec::FloatBits(f);
  }
}

TEST(KvRowCodec, HadamardIsTheCpuTransformBitForBit) {
  std::mt19937 gen(2);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int n = 2; n <= 256; n *= 2) {
    std::vector<float> a(n), b;
    for (float& x : a) x = dist(gen);
    b = a;
    HadamardInPlace(a.data(), n);
    codec::Hadamard(b.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(codec::FloatBits(a[i]), codec::FloatBits(b[i])) << n;
  }
}

// Rows of several shapes and value ranges: ordinary, with outliers, constant, all zero, with
// negative zeros, tiny (subnormal halves) and large.
std::vector<std::vector<float>> Rows(int hd, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::vector<float>> rows;
  for (float scale : {1.0f, 0.01f, 1e-6f, 300.0f}) {
    std::vector<float> r(hd);
    for (float& x : r) x = scale * dist(gen);
    rows.push_back(r);
    r[hd / 2] = 40.0f * scale;  // an outlier channel
    rows.push_back(r);
  }
  rows.push_back(std::vector<float>(hd, 0.0f));
  rows.push_back(std::vector<float>(hd, -0.0f));
  rows.push_back(std::vector<float>(hd, 1.25f));
  std::vector<float> mixed(hd);
  for (int i = 0; i < hd; ++i) mixed[i] = i % 3 == 0 ? -0.0f : (i % 3 == 1 ? 0.0f : -2.0f);
  rows.push_back(mixed);
  // Zero extremes of both signs at several indices (the sign EncodeRow keeps is that of the
  // first), and a repeated maximum spread over lanes and registers.
  std::vector<float> zeros(hd, 1.5f);
  for (int i = 0; i < hd; i += 5) zeros[i] = (i / 5) % 2 ? 0.0f : -0.0f;
  rows.push_back(zeros);
  for (float& z : zeros) z = -z;
  rows.push_back(zeros);
  std::vector<float> ties(hd, -1.0f);
  for (int i = 1; i < hd; i += 7) ties[i] = 3.0f;
  rows.push_back(ties);
  return rows;
}

// WarpEncodeInt2Row (cuda_kv_kernels.cu) lane by lane: each lane's partial over its
// registers, the xor butterfly (every lane must end with lane 0's bits), the candidate loop,
// codes packed from lanes l .. l + 3.
std::vector<uint8_t> WarpPlanEncodeInt2(const std::vector<float>& x, int hd) {
  constexpr int kLanes = 32, kRegs = codec::kMaxHeadDim / 32;
  auto lane_sum = [&](auto term) {
    float p[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      p[l] = 0.0f;
      for (int r = 0; r < kRegs; ++r) {
        if (l + 32 * r < hd) p[l] = codec::AddRn(p[l], term(x[l + 32 * r]));
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      float next[kLanes];
      for (int l = 0; l < kLanes; ++l) next[l] = codec::AddRn(p[l], p[l ^ off]);
      std::copy(next, next + kLanes, p);
    }
    for (int l = 1; l < kLanes; ++l) EXPECT_EQ(codec::FloatBits(p[l]), codec::FloatBits(p[0]));
    return p[0];
  };
  const float n = static_cast<float>(hd);
  const float mean = codec::DivRn(lane_sum([](float v) { return v; }), n);
  const float sigma = codec::SqrtRn(codec::DivRn(lane_sum([&](float v) {
                                                   const float c = codec::SubRn(v, mean);
                                                   return codec::MulRn(c, c);
                                                 }),
                                                 n));
  int best = 0;
  float best_err = 0.0f;
  for (int k = 0; k < codec::kInt2Candidates; ++k) {
    const codec::Int2Params c = codec::Int2ParamsFor(mean, sigma, k);
    const float err = lane_sum([&](float v) { return codec::Int2Error(v, c); });
    if (k == 0 || err < best_err) {
      best = k;
      best_err = err;
    }
  }
  const codec::Int2Params c = codec::Int2ParamsFor(mean, sigma, best);
  std::vector<uint8_t> row(codec::RowBytes(codec::kInt2, hd), 0xab);
  codec::StoreU16(row.data(), c.scale_h);
  codec::StoreU16(row.data() + 2, c.min_h);
  for (int d = 0; d < hd; d += 4) {
    int b = 0;
    for (int j = 0; j < 4; ++j) b |= (d + j < hd ? codec::Int2Level(x[d + j], c) : 0) << (2 * j);
    row[4 + d / 4] = static_cast<uint8_t>(b);
  }
  return row;
}

// The GPU's warp-per-row encoder (cuda_kv_kernels.cu, WarpEncodeRow) simulated lane by lane
// on the host: value lane + 32 r on each lane, per-lane steps, xor-butterfly reductions of
// the max |x| and of the Extremes, int4 pairs from neighbouring lanes. What it checks is the
// plan's arithmetic (order of the reductions, their neutral values, the pairing), with the
// same kv_codec functions the kernel calls.
std::vector<uint8_t> WarpPlanEncode(int cls, const std::vector<float>& x, int hd) {
  constexpr int kLanes = 32, kRegs = codec::kMaxHeadDim / 32;
  std::vector<uint8_t> row(codec::RowBytes(cls, hd), 0xab);
  const auto valid = [&](int lane, int r) { return lane + 32 * r < hd; };
  if (cls == codec::kFull) {
    codec::EncodeRow(cls, x.data(), hd, row.data());  // per value, no reduction
    return row;
  }
  if (cls == codec::kInt8) {
    float amax[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      amax[l] = 0.0f;
      for (int r = 0; r < kRegs; ++r) {
        if (valid(l, r)) amax[l] = codec::AbsMaxStep(amax[l], x[l + 32 * r]);
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      float next[kLanes];
      for (int l = 0; l < kLanes; ++l) next[l] = codec::AbsMaxStep(amax[l], amax[l ^ off]);
      std::copy(next, next + kLanes, amax);
    }
    for (int l = 1; l < kLanes; ++l)
      EXPECT_EQ(codec::FloatBits(amax[l]), codec::FloatBits(amax[0]));
    const codec::Int8Params p = codec::Int8ParamsFor(amax[0]);
    codec::StoreF32(row.data(), p.scale);
    for (int d = 0; d < hd; ++d) row[4 + d] = codec::Int8Byte(x[d], p.inv);
    return row;
  }
  if (cls == codec::kInt2) return WarpPlanEncodeInt2(x, hd);
  codec::Extremes e[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    e[l] = codec::Extremes{INFINITY, 1 << 30, -INFINITY, 1 << 30};
    for (int r = 0; r < kRegs; ++r) {
      if (valid(l, r)) e[l] = codec::Combine(e[l], codec::ExtremesOf(x[l + 32 * r], l + 32 * r));
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    codec::Extremes next[kLanes];
    for (int l = 0; l < kLanes; ++l) next[l] = codec::Combine(e[l], e[l ^ off]);
    std::copy(next, next + kLanes, e);
  }
  const codec::Int4Params p = codec::Int4ParamsFor(e[0].lo, e[0].hi);
  codec::StoreU16(row.data(), p.scale_h);
  codec::StoreU16(row.data() + 2, p.min_h);
  for (int l = 0; l < kLanes; l += 2) {
    for (int r = 0; r < kRegs; ++r) {
      if (!valid(l, r)) continue;
      const int d = l + 32 * r;
      const int q_next = valid(l + 1, r) ? codec::Int4Level(x[d + 1], p) : 0;
      row[4 + d / 2] = static_cast<uint8_t>(codec::Int4Level(x[d], p) | (q_next << 4));
    }
  }
  return row;
}

class KvRowCodecShapes : public ::testing::TestWithParam<int> {};

TEST_P(KvRowCodecShapes, EncodeIsTheCpuEncodingAndDecodeItsValues) {
  const int hd = GetParam();
  for (int cls = 0; cls < codec::kNumClasses; ++cls) {
    const KvPrecision p = static_cast<KvPrecision>(cls);
    ASSERT_EQ(static_cast<size_t>(codec::RowBytes(cls, hd)), KvRowBytes(p, hd));
    for (const std::vector<float>& x : Rows(hd, 10 + hd + cls)) {
      std::vector<uint8_t> want(KvRowBytes(p, hd)), got(want.size(), 0xab);
      KvEncodeRow(p, x.data(), hd, want.data());
      codec::EncodeRow(cls, x.data(), hd, got.data());
      ASSERT_EQ(got, want) << KvPrecisionName(p) << " hd " << hd;
      ASSERT_EQ(WarpPlanEncode(cls, x, hd), want)
          << "warp plan, " << KvPrecisionName(p) << " hd " << hd;
      std::vector<float> a(hd), b(hd);
      KvDecodeRow(p, want.data(), hd, a.data());
      codec::DecodeRow(cls, got.data(), hd, b.data());
      // f16 and int8 decode exactly; int4's min + scale * q may be contracted into one
      // fma on either side: within one rounding of the value.
      for (int d = 0; d < hd; ++d) {
        if (cls == 2 || cls == 3) {
          ASSERT_NEAR(b[d], a[d], 1e-6f * (std::fabs(a[d]) + 1e-30f) + 1e-38f) << d;
        } else {
          ASSERT_EQ(codec::FloatBits(b[d]), codec::FloatBits(a[d])) << d;
        }
        ASSERT_EQ(codec::DecodeAt(cls, got.data(), d), b[d]);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, KvRowCodecShapes, ::testing::Values(2, 6, 16, 64, 80, 128, 256));

TEST(KvFrameAllocator, ClassesShareChunksAndFramesNeverOverlap) {
  // f16, int8, int4, int2 of some geometry
  const std::array<int64_t, KvFrameAllocator::kClasses> page = {1024, 544, 288, 160};
  KvFrameAllocator a(/*n_chunks=*/6, /*chunk_bytes=*/4096, page);
  EXPECT_EQ(a.arena_bytes(), 6 * 4096);
  EXPECT_EQ(a.frames_per_chunk(0), 4);
  EXPECT_EQ(a.frames_per_chunk(1), 7);
  EXPECT_EQ(a.frames_per_chunk(2), 14);
  EXPECT_EQ(a.frames_per_chunk(3), 25);
  EXPECT_EQ(a.MaxFrames(3), 6 * 25);
  std::mt19937 rng(3);
  std::map<int64_t, int> live;  // offset -> class
  auto check_disjoint = [&] {
    int64_t end = 0;
    for (const auto& [off, c] : live) {
      ASSERT_GE(off, end);
      ASSERT_LE(off + page[c], a.arena_bytes());
      // A frame lies inside one chunk.
      ASSERT_EQ(off / 4096, (off + page[c] - 1) / 4096);
      end = off + page[c];
    }
  };
  for (int step = 0; step < 5000; ++step) {
    const int c = static_cast<int>(rng() % KvFrameAllocator::kClasses);
    if (rng() % 2 == 0 || live.empty()) {
      const int64_t off = a.Allocate(c);
      if (off < 0) {
        // Full for this class: every chunk serves some class and none of c's has room.
        EXPECT_EQ(a.free_chunks(), 0);
        continue;
      }
      ASSERT_EQ(live.count(off), 0u);
      live[off] = c;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Release(it->second, it->first);
      live.erase(it);
    }
    check_disjoint();
  }
  for (const auto& [off, c] : live) a.Release(c, off);
  EXPECT_EQ(a.free_chunks(), 6);
  // Everything back: the whole arena serves one class again.
  for (int i = 0; i < 6 * 14; ++i) ASSERT_GE(a.Allocate(2), 0) << i;
  EXPECT_LT(a.Allocate(2), 0);
  EXPECT_LT(a.Allocate(0), 0);
}

TEST(KvPassTables, OffsetsRowsAndMassReduction) {
  KvPoolGeometry g;
  g.n_layers = 3;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.gqa_group = 2;
  g.page_tokens = 4;
  const std::array<int64_t, kNumKvPrecisions> stride = {2 * 2 * 16, 2 * 2 * 12, 2 * 2 * 8,
                                                        2 * 2 * 6};
  std::vector<KvPagePlace> pages = {{1000, 0}, {5000, 2}, {9000, 1}};
  // Sequence A: 6 positions, position 1 evicted, 4 and 5 in other classes; a pass of its
  // last 2 rows, position 5 observed. Sequence B: 2 positions, a pass of both, unobserved.
  std::vector<KvSlot> a = {{0, 0}, {-1, 0}, {0, 1}, {0, 2}, {1, 3}, {2, 0}};
  std::vector<KvSlot> b = {{0, 3}, {2, 1}};
  std::vector<float> sum(2 * 4, 0.0f), cnt(2 * 4, 0.0f);
  // Position 5, min_distance 2, lo 0: keys [0, 4) observed, width 4.
  const KvMassRow row{5, 0, sum.data(), cnt.data()};
  KvPoolPassSeq sa;
  sa.seq = 7;
  sa.pos0 = 4;
  sa.n = 2;
  sa.slots = a;
  sa.mass.on = true;
  sa.mass.min_distance = 2;
  sa.mass.rows = {&row, 1};
  KvPoolPassSeq sb;
  sb.seq = 8;
  sb.pos0 = 0;
  sb.n = 2;
  sb.slots = b;
  const std::vector<KvPoolPassSeq> seqs = {sa, sb};
  const KvPassTables t = BuildKvPassTables(seqs, pages, stride, g);
  ASSERT_EQ(t.tok.size(), 3u * 8);
  auto tok_off = [&](int e) {
    return static_cast<int64_t>(static_cast<uint32_t>(t.tok[3 * e])) |
           (static_cast<int64_t>(t.tok[3 * e + 1]) << 32);
  };
  EXPECT_EQ(tok_off(0), 1000);
  EXPECT_EQ(t.tok[3 * 1 + 2], -1);  // evicted
  EXPECT_EQ(tok_off(3), 1000 + 2 * stride[0]);
  EXPECT_EQ(tok_off(4), 5000 + 3 * stride[2]);
  EXPECT_EQ(t.tok[3 * 4 + 2], 2);
  EXPECT_EQ(tok_off(5), 9000);
  EXPECT_EQ(tok_off(6), 1000 + 3 * stride[0]);  // B's first entry
  EXPECT_EQ(tok_off(7), 9000 + 1 * stride[1]);
  ASSERT_EQ(t.n_rows(), 4);
  const std::vector<int32_t> rows = {0, 5, 0, 0, 0,   // A pos 4: unobserved
                                     0, 6, 0, 4, 0,   // A pos 5: lo 0, width 4, offset 0
                                     6, 1, 0, 0, 0,   // B pos 0
                                     6, 2, 0, 0, 0};  // B pos 1
  EXPECT_EQ(t.rows, rows);
  EXPECT_EQ(t.mass_floats, 4 * 4);  // n_heads (4) * width
  ASSERT_EQ(t.observed.size(), 1u);
  // Mass as the kernel leaves it: [head][key] = 10 * head + key.
  std::vector<float> mass(t.mass_floats);
  for (int h = 0; h < 4; ++h) {
    for (int j = 0; j < 4; ++j) mass[h * 4 + j] = 10.0f * h + j;
  }
  AddKvPassMass(t, seqs, mass.data(), g);
  for (int kv = 0; kv < 2; ++kv) {
    for (int j = 0; j < 4; ++j) {
      const bool evicted = j == 1;
      const float want = evicted ? 0.0f : (10.0f * (2 * kv) + j) + (10.0f * (2 * kv + 1) + j);
      EXPECT_EQ(sum[kv * 4 + j], want) << kv << " " << j;
      EXPECT_EQ(cnt[kv * 4 + j], evicted ? 0.0f : 2.0f * 3) << kv << " " << j;
    }
  }
}

// With per-layer windows the count is per layer that saw the key: layer 0 a window of 2,
// layer 1 a window of 5, layer 2 none. Row at length 6 (position 5): key j is at distance
// 6 - j, seen by layer 0 for j >= 4, by layer 1 for j >= 1, by layer 2 always.
TEST(KvPassTables, MassCountsOnlyTheLayersWhoseWindowHoldsTheKey) {
  KvPoolGeometry g;
  g.n_layers = 3;
  g.n_kv_heads = 1;
  g.head_dim = 8;
  g.gqa_group = 2;
  g.page_tokens = 8;
  const std::array<int64_t, kNumKvPrecisions> stride = {2 * 16, 2 * 12, 2 * 8, 2 * 6};
  std::vector<KvPagePlace> pages = {{0, 0}};
  std::vector<KvSlot> a = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}};
  std::vector<float> sum(5, 0.0f), cnt(5, 0.0f);
  const KvMassRow row{5, 0, sum.data(), cnt.data()};  // min_distance 1: keys [0, 5)
  KvPoolPassSeq sa;
  sa.seq = 1;
  sa.pos0 = 5;
  sa.n = 1;
  sa.slots = a;
  sa.mass.on = true;
  sa.mass.min_distance = 1;
  sa.mass.rows = {&row, 1};
  const std::vector<KvPoolPassSeq> seqs = {sa};
  const KvPassTables t = BuildKvPassTables(seqs, pages, stride, g);
  ASSERT_EQ(t.mass_floats, 2 * 5);
  const std::vector<float> mass(t.mass_floats, 1.0f);
  const std::vector<int32_t> windows = {2, 5, 0};
  AddKvPassMass(t, seqs, mass.data(), g, windows);
  const std::vector<float> layers = {1, 2, 2, 2, 3};  // layers seeing keys 0..4
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(sum[j], 2.0f) << j;  // the kernel already left 0 for unseen (layer, key)
    EXPECT_EQ(cnt[j], 2.0f * layers[j]) << j;
  }
}

// A draft tree's rows (KvPoolPassSeq::parents): 3 cached positions, then a pass of the root
// (row 0) and nodes 1 (under 0), 2 (under 0), 3 (under 2). Each row lists the cached
// positions then its path's slots; its length is pos0 + depth + 1; the manager's mass row
// for row 3 (position 3 + 2 = 5) is matched by row, not by slot.
TEST(KvPassTables, TreeRowsSeeTheContextAndTheirPathOnly) {
  KvPoolGeometry g;
  g.n_layers = 1;
  g.n_kv_heads = 1;
  g.head_dim = 8;
  g.gqa_group = 2;
  g.page_tokens = 8;
  const std::array<int64_t, kNumKvPrecisions> stride = {2 * 16, 2 * 12, 2 * 8, 2 * 6};
  std::vector<KvPagePlace> pages = {{0, 0}};
  std::vector<KvSlot> a;
  for (int j = 0; j < 7; ++j) a.push_back({0, j});
  a[1] = {-1, 0};  // position 1 evicted
  const std::vector<int32_t> parents = {-1, 0, 0, 2};
  std::vector<float> sum(3, 0.0f), cnt(3, 0.0f);
  KvMassRow observed{5, 0, sum.data(), cnt.data(), /*row=*/3};  // min_distance 3: keys [0, 3)
  KvPoolPassSeq sa;
  sa.seq = 1;
  sa.pos0 = 3;
  sa.n = 4;
  sa.slots = a;
  sa.parents = parents;
  sa.mass.on = true;
  sa.mass.min_distance = 3;
  sa.mass.rows = {&observed, 1};
  const std::vector<KvPoolPassSeq> seqs = {sa};
  const KvPassTables t = BuildKvPassTables(seqs, pages, stride, g);
  ASSERT_EQ(t.n_rows(), 4);
  // Lists: row 0 [0 1 2 | 3], row 1 [0 1 2 | 3 4], row 2 [0 1 2 | 3 5], row 3 [0 1 2 | 3 5 6].
  const std::vector<int32_t> rows = {0,  4, 0, 0, 0,   // row 0: depth 0
                                     4,  5, 0, 0, 0,   // row 1: depth 1
                                     9,  5, 0, 0, 0,   // row 2: depth 1 (a sibling of 1)
                                     14, 6, 0, 3, 0};  // row 3: depth 2, observed
  EXPECT_EQ(t.rows, rows);
  ASSERT_EQ(t.tok.size(), 3u * 20);
  auto slot_of = [&](int e) { return t.tok[3 * e] / stride[0]; };
  const std::vector<int> want_slots = {0,  -1, 2, 3, 0, -1, 2, 3, 4, 0,
                                       -1, 2,  3, 5, 0, -1, 2, 3, 5, 6};
  for (int e = 0; e < 20; ++e) {
    if (want_slots[e] < 0) {
      EXPECT_EQ(t.tok[3 * e + 2], -1) << e;
    } else {
      EXPECT_EQ(slot_of(e), want_slots[e]) << e;
    }
  }
  ASSERT_EQ(t.observed.size(), 1u);
  EXPECT_EQ(t.observed[0].row, 3);
  EXPECT_EQ(t.observed[0].sink, &observed);
  // The observed row's keys 0..2 (key 1 evicted: never counted).
  const std::vector<float> mass(t.mass_floats, 1.0f);
  AddKvPassMass(t, seqs, mass.data(), g);
  EXPECT_EQ(cnt, (std::vector<float>{2, 0, 2}));
  EXPECT_EQ(sum, (std::vector<float>{2, 0, 2}));
}

TEST(KvAttentionChunks, AWindowedRowIsCutAsARowOfItsWindow) {
  EXPECT_EQ(kv_chunks::WindowStart(100, 0), 0);
  EXPECT_EQ(kv_chunks::WindowStart(100, 100), 0);
  EXPECT_EQ(kv_chunks::WindowStart(100, 101), 0);
  EXPECT_EQ(kv_chunks::WindowStart(100, 30), 70);  // positions [70, 100): the last 30
  EXPECT_EQ(kv_chunks::WindowStart(1, 1), 0);
  EXPECT_EQ(kv_chunks::WindowStart(2, 1), 1);  // the row's own position only
}

TEST(KvAttentionChunks, EveryPositionInExactlyOneChunkInOrder) {
  for (int length = 0; length <= 20000; length += length < 2100 ? 1 : 97) {
    const int z = kv_chunks::ChunkCount(length);
    ASSERT_GE(z, 1);
    ASSERT_LE(z, kv_chunks::kMaxChunks);
    if (length > kv_chunks::kChunkMin) {
      ASSERT_GT(z, 1) << length;
    }
    int next = 0;
    for (int c = 0; c < z; ++c) {
      int b, e;
      kv_chunks::ChunkBounds(length, c, &b, &e);
      ASSERT_EQ(b, next) << "length " << length << " chunk " << c;
      ASSERT_LE(b, e);
      if (z > 1) {
        ASSERT_GE(e - b, std::min(kv_chunks::kChunkMin / 2, length - b)) << length;
      }
      next = e;
    }
    ASSERT_EQ(next, length);
  }
}

// Partials of a random score vector merged in chunk order give the whole softmax-weighted
// sum; empty chunks (l == 0) change nothing, and a single chunk is copied exactly.
TEST(KvAttentionChunks, MergedPartialsAreTheWholeSoftmax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const int n = 3000;
  std::vector<float> s(n), v(n);
  for (int j = 0; j < n; ++j) {
    s[j] = normal(rng);
    v[j] = normal(rng);
  }
  double num = 0, den = 0, mx = -1e30;
  for (float x : s) mx = std::max<double>(mx, x);
  for (int j = 0; j < n; ++j) {
    num += std::exp(s[j] - mx) * v[j];
    den += std::exp(s[j] - mx);
  }
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  kv_chunks::MergePartial(-INFINITY, 0.0f, 0.0f, &m, &l, &acc);  // an empty chunk
  EXPECT_EQ(l, 0.0f);
  const int z = kv_chunks::ChunkCount(n);
  for (int c = 0; c < z; ++c) {
    int b, e;
    kv_chunks::ChunkBounds(n, c, &b, &e);
    float mc = -INFINITY, lc = 0.0f, ac = 0.0f;
    for (int j = b; j < e; ++j) mc = std::max(mc, s[j]);
    for (int j = b; j < e; ++j) {
      lc += std::exp(s[j] - mc);
      ac += std::exp(s[j] - mc) * v[j];
    }
    kv_chunks::MergePartial(mc, lc, ac, &m, &l, &acc);
    if (c == 0) {
      EXPECT_EQ(m, mc);  // copied exactly into the empty state
      EXPECT_EQ(l, lc);
      EXPECT_EQ(acc, ac);
    }
  }
  EXPECT_NEAR(acc / l, num / den, 1e-4 * (1 + std::fabs(num / den)));
  EXPECT_FLOAT_EQ(m, static_cast<float>(mx));
}

}  // namespace
}  // namespace specnode
