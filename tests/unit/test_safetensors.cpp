// Safetensors reader and writer: round trips of every dtype through the streaming writer, and one
// hand-built file per rejection rule, each checked for a one-line message naming file and cause.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "safetensors_test_util.h"

namespace mla::io {
namespace {

using test_util::raw_safetensors;
using test_util::random_bytes;
using test_util::read_bytes;
using test_util::TempDir;
using test_util::write_bytes;

constexpr DType kAllDtypes[] = {DType::BF16, DType::F16, DType::F32, DType::F8_E4M3, DType::U8,
                                DType::I8,   DType::I32, DType::I64, DType::BOOL};

// Writes `bytes` to a file in a fresh directory and expects open() and the pure parser to reject
// it with a one-line message containing the file name and every needle.
void expect_rejected(const std::vector<uint8_t>& bytes, std::initializer_list<std::string_view> needles) {
  TempDir dir;
  const std::string path = dir.file("model-00001.safetensors");
  write_bytes(path, bytes);
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.is_ok()) << "file was accepted";
  const std::string msg = f.status().message();
  EXPECT_NE(msg.find("model-00001.safetensors"), std::string::npos) << msg;
  for (std::string_view needle : needles) {
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
  }
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  const auto parsed = parse_safetensors_header(bytes, "direct.safetensors");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_EQ(parsed.status().message().rfind("direct.safetensors: ", 0), 0u) << parsed.status().message();
}

std::vector<uint8_t> one_tensor(std::string_view entry, size_t data_bytes) {
  return raw_safetensors(fmt::format(R"({{"w":{}}})", entry), data_bytes);
}

// ---- accepted files ----------------------------------------------------------------------------

TEST(SafetensorsWriter, RoundTripsEveryDtype) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> expected;
  std::vector<int> fill_calls(std::size(kAllDtypes), 0);
  for (size_t i = 0; i < std::size(kAllDtypes); ++i) {
    const DType dt = kAllDtypes[i];
    const std::vector<int64_t> shape = {3, int64_t(i) + 2};
    expected.push_back(random_bytes(size_t(3 * (i + 2)) * dtype_size(dt), 100 + i));
    w.add(fmt::format("t.{}", dtype_name(dt)), dt, shape, [&expected, &fill_calls, i](std::span<uint8_t> out) {
      ++fill_calls[i];
      ASSERT_EQ(out.size(), expected[i].size());
      std::copy(expected[i].begin(), expected[i].end(), out.begin());
    });
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "round \"trip\"\n"}};
  w.set_metadata(meta);
  ASSERT_TRUE(w.write(path).is_ok());
  for (int c : fill_calls) EXPECT_EQ(c, 1);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), std::size(kAllDtypes));
  uint64_t total = 0;
  for (size_t i = 0; i < std::size(kAllDtypes); ++i) {
    const std::string name = fmt::format("t.{}", dtype_name(kAllDtypes[i]));
    const TensorInfo* info = f->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->dtype, kAllDtypes[i]);
    EXPECT_EQ(info->shape, (std::vector<int64_t>{3, int64_t(i) + 2}));
    EXPECT_EQ(info->nbytes(), expected[i].size());
    const TensorView v = f->view(*info);
    EXPECT_EQ(v.dtype, kAllDtypes[i]);
    ASSERT_EQ(v.ndim, 2);
    EXPECT_EQ(v.dim(0), 3);
    EXPECT_EQ(v.dim(1), int64_t(i) + 2);
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_EQ(std::memcmp(v.data, expected[i].data(), expected[i].size()), 0) << name;
    const auto raw = f->bytes(*info);
    EXPECT_TRUE(std::equal(raw.begin(), raw.end(), expected[i].begin(), expected[i].end())) << name;
    auto by_name = f->tensor(name);
    ASSERT_TRUE(by_name.is_ok());
    EXPECT_EQ(by_name->data, v.data);
    total += expected[i].size();
  }
  EXPECT_EQ(f->data_size(), total);
  // tensors() is in data-offset order.
  for (size_t i = 1; i < f->tensors().size(); ++i) EXPECT_EQ(f->tensors()[i].begin, f->tensors()[i - 1].end);
}

TEST(SafetensorsWriter, PadsHeaderToEightBytesWithSpaces) {
  TempDir dir;
  for (size_t name_len = 1; name_len <= 9; ++name_len) {
    const std::string path = dir.file(fmt::format("pad{}.safetensors", name_len));
    SafetensorsWriter w;
    w.add(std::string(name_len, 'x'), DType::BF16, {5}, [](std::span<uint8_t> out) { out[0] = 9; });
    ASSERT_TRUE(w.write(path).is_ok());
    const auto bytes = read_bytes(path);
    const auto parsed = parse_safetensors_header(bytes, path);
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
    EXPECT_EQ(parsed->data_start % 8, 0u) << name_len;
    EXPECT_EQ(bytes.size(), parsed->data_start + 10);
    // Any padding is spaces directly before the data section.
    const std::string header(bytes.begin() + 8, bytes.begin() + std::ptrdiff_t(parsed->data_start));
    const size_t close = header.rfind('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
    EXPECT_EQ(bytes[parsed->data_start], 9);  // first byte of the only tensor
  }
}

TEST(SafetensorsWriter, ScalarEmptyAndHighRankTensors) {
  TempDir dir;
  const std::string path = dir.file("shapes.safetensors");
  SafetensorsWriter w;
  w.add("scalar", DType::F32, {}, [](std::span<uint8_t> out) {
    const float v = 2.5f;
    ASSERT_EQ(out.size(), 4u);
    std::memcpy(out.data(), &v, 4);
  });
  w.add("empty", DType::I64, {0, 7}, [](std::span<uint8_t> out) { EXPECT_TRUE(out.empty()); });
  w.add("rank5", DType::U8, {1, 2, 1, 2, 3}, [](std::span<uint8_t> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(i + 1);
  });
  ASSERT_TRUE(w.write(path).is_ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();

  auto scalar = f->tensor("scalar");
  ASSERT_TRUE(scalar.is_ok());
  EXPECT_EQ(scalar->ndim, 0);
  EXPECT_EQ(scalar->numel(), 1);
  float got = 0;
  std::memcpy(&got, scalar->data, 4);
  EXPECT_EQ(got, 2.5f);

  const TensorInfo* empty = f->find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->begin, empty->end);
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(f->tensor("empty")->numel(), 0);

  // Valid in the file, but a TensorView holds at most kMaxDims dims.
  auto rank5 = f->tensor("rank5");
  ASSERT_FALSE(rank5.is_ok());
  EXPECT_NE(rank5.status().message().find("'rank5'"), std::string::npos) << rank5.status().message();
  EXPECT_NE(rank5.status().message().find("5 dims"), std::string::npos) << rank5.status().message();
  const auto raw = f->bytes(*f->find("rank5"));
  ASSERT_EQ(raw.size(), 12u);
  EXPECT_EQ(raw[11], 12);

  auto missing = f->tensor("nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
  EXPECT_FALSE(f->contains("nope"));
}

TEST(SafetensorsWriter, ReportsProgressUpToTotal) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("a", DType::F32, {10}, [](std::span<uint8_t>) {});
  w.add("b", DType::BF16, {3, 3}, [](std::span<uint8_t>) {});
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  w.set_progress([&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); });
  ASSERT_TRUE(w.write(dir.file("p.safetensors")).is_ok());
  ASSERT_FALSE(calls.empty());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, 58u);
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first);
    }
  }
  EXPECT_EQ(calls.back().first, 58u);
}

TEST(SafetensorsWriter, RejectsBadAdds) {
  TempDir dir;
  {
    SafetensorsWriter w;
    w.add("dup", DType::F32, {1}, [](std::span<uint8_t>) {});
    w.add("dup", DType::F32, {1}, [](std::span<uint8_t>) {});
    const Status st = w.write(dir.file("a.safetensors"));
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("'dup'"), std::string::npos) << st.message();
  }
  {
    SafetensorsWriter w;
    w.add("__metadata__", DType::F32, {1}, [](std::span<uint8_t>) {});
    EXPECT_FALSE(w.write(dir.file("b.safetensors")).is_ok());
  }
  {
    SafetensorsWriter w;
    w.add("neg", DType::F32, {2, -1}, [](std::span<uint8_t>) {});
    const Status st = w.write(dir.file("c.safetensors"));
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("'neg'"), std::string::npos) << st.message();
  }
  {
    SafetensorsWriter w;
    w.add("huge", DType::F32, {int64_t(1) << 40, int64_t(1) << 30}, [](std::span<uint8_t>) {});
    EXPECT_FALSE(w.write(dir.file("d.safetensors")).is_ok());
  }
  {
    SafetensorsWriter w;
    w.add("bad\xff", DType::F32, {1}, [](std::span<uint8_t>) {});
    const Status st = w.write(dir.file("f.safetensors"));
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("not valid UTF-8"), std::string::npos) << st.message();
  }
  {  // Unwritable destination: error, nothing left behind.
    SafetensorsWriter w;
    w.add("x", DType::F32, {1}, [](std::span<uint8_t>) {});
    const std::string path = dir.file("no/such/dir/e.safetensors");
    EXPECT_FALSE(w.write(path).is_ok());
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  for (const char* f : {"a", "b", "c", "d", "f"}) {
    EXPECT_FALSE(std::filesystem::exists(dir.file(fmt::format("{}.safetensors", f)))) << f;
  }
}

TEST(SafetensorsReader, OpensLargeHeaderInLinearTime) {
  // Guards against quadratic JSON handling: 30k entries take well under a second when linear,
  // and minutes with nlohmann's parser_callback DOM path, which rescans the root per entry.
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  SafetensorsWriter w;
  constexpr int kTensors = 30000;
  for (int i = 0; i < kTensors; ++i) {
    w.add(fmt::format("model.layers.{}.mlp.experts.{}.w", i / 384, i % 384), DType::U8, {1},
          [i](std::span<uint8_t> out) { out[0] = uint8_t(i); });
  }
  ASSERT_TRUE(w.write(path).is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto f = SafetensorsFile::open(path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), size_t(kTensors));
  EXPECT_EQ(f->bytes(*f->find("model.layers.3.mlp.experts.7.w"))[0], uint8_t(3 * 384 + 7));
  EXPECT_LT(seconds, 20.0);
}

TEST(SafetensorsReader, AcceptsEmptyHeaderEndingAtEof) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  write_bytes(path, raw_safetensors("{}", 0));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->data_size(), 0u);
}

TEST(SafetensorsReader, AcceptsOnlyZeroSizeTensorsWithNoData) {
  const auto bytes = raw_safetensors(
      R"({"a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"b":{"dtype":"I8","shape":[4,0],"data_offsets":[0,0]}})", 0);
  const auto parsed = parse_safetensors_header(bytes, "z.safetensors");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0].numel(), 0);
}

TEST(SafetensorsReader, AcceptsTrailingWhitespacePadding) {
  const auto bytes = raw_safetensors("{\"__metadata__\":{\"k\":\"v\"}} \t\r\n  ", 0);
  const auto parsed = parse_safetensors_header(bytes, "ws.safetensors");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  EXPECT_EQ(parsed->metadata.at("k"), "v");
}

TEST(SafetensorsReader, SortsTensorsByOffsetAndAcceptsUnalignedHeaders) {
  TempDir dir;
  const std::string path = dir.file("order.safetensors");
  // Keys in name order, data in the opposite order; header length 121 is not a multiple of 8.
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string padded = header + std::string(121 - header.size(), ' ');
  write_bytes(path, raw_safetensors(padded, 8));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "b");
  EXPECT_EQ(f->tensors()[1].name, "a");
  // Data byte i is i*7+1; tensor a starts at data byte 4.
  EXPECT_EQ(f->bytes(*f->find("a"))[0], uint8_t(4 * 7 + 1));
  EXPECT_TRUE(f->is_aligned(*f->find("a")));   // U8 is always aligned
  EXPECT_FALSE(f->is_aligned(*f->find("b")));  // F32 at page offset 8 + 121
}

TEST(SafetensorsReader, MovedFileKeepsViewsValid) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  write_bytes(path, one_tensor(R"({"dtype":"U8","shape":[3],"data_offsets":[0,3]})", 3));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok());
  const TensorView before = f->view(*f->find("w"));
  SafetensorsFile moved = std::move(f).value();
  const TensorView after = moved.view(*moved.find("w"));
  EXPECT_EQ(before.data, after.data);
  EXPECT_EQ(static_cast<const uint8_t*>(after.data)[2], uint8_t(2 * 7 + 1));
}

// ---- rejected files: length prefix and encoding ------------------------------------------------

TEST(SafetensorsReader, RejectsMissingFile) {
  TempDir dir;
  auto f = SafetensorsFile::open(dir.file("absent.safetensors"));
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("absent.safetensors"), std::string::npos);
}

TEST(SafetensorsReader, RejectsDirectory) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("d.safetensors"));
  auto f = SafetensorsFile::open(dir.file("d.safetensors"));
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos);
}

TEST(SafetensorsReader, RejectsEmptyFile) { expect_rejected({}, {"0 bytes", "shorter than the 8-byte"}); }

TEST(SafetensorsReader, RejectsFileShorterThanPrefix) {
  expect_rejected({1, 0, 0, 0, 0}, {"5 bytes", "shorter than the 8-byte"});
}

TEST(SafetensorsReader, RejectsZeroHeaderLength) { expect_rejected(raw_safetensors("", 16), {"header length is 0"}); }

TEST(SafetensorsReader, RejectsHeaderLengthOverLimit) {
  expect_rejected(raw_safetensors("{}", 0, 100'000'001), {"header length 100000001 exceeds the limit"});
}

TEST(SafetensorsReader, RejectsHugeHeaderLengthWithoutOverflow) {
  expect_rejected(raw_safetensors("{}", 0, ~uint64_t(0)), {"header length 18446744073709551615 exceeds"});
}

TEST(SafetensorsReader, RejectsHeaderLengthPastEndOfFile) {
  expect_rejected(raw_safetensors("{}", 0, 3), {"header length 3 runs past the end of the file", "2 bytes"});
}

TEST(SafetensorsReader, RejectsInvalidUtf8Header) {
  expect_rejected(raw_safetensors("{\"a\xff\":1}", 0), {"not valid UTF-8", "offset 3"});
  expect_rejected(raw_safetensors("{\"\xed\xa0\x80\":1}", 0), {"not valid UTF-8"});  // surrogate
  expect_rejected(raw_safetensors("{\"\xc0\xaf\":1}", 0), {"not valid UTF-8"});      // overlong '/'
}

TEST(SafetensorsReader, RejectsNonObjectHeader) {
  expect_rejected(raw_safetensors("[1, 2]", 0), {"does not start with '{'"});
  expect_rejected(raw_safetensors(" {}", 0), {"does not start with '{'"});
}

TEST(SafetensorsReader, RejectsMalformedJson) {
  expect_rejected(raw_safetensors(R"({"w": })", 0), {"not valid JSON"});
  expect_rejected(raw_safetensors(R"({"w": {"dtype": "F32")", 0), {"not valid JSON"});
}

TEST(SafetensorsReader, RejectsTrailingGarbage) {
  expect_rejected(raw_safetensors("{}  x", 0), {"not valid JSON"});
  expect_rejected(raw_safetensors(std::string("{}\0\0", 4), 0), {"not valid JSON", "NUL byte at offset 2"});
  expect_rejected(raw_safetensors("{}{}", 0), {"not valid JSON"});
}

TEST(SafetensorsReader, RejectsDeepNestingWithoutCrashing) {
  std::string deep = R"({"w":{"dtype":"F32","shape":)";
  deep += std::string(5000, '[') + std::string(5000, ']') + R"(,"data_offsets":[0,0]}})";
  expect_rejected(raw_safetensors(deep, 0), {"nested deeper than"});
}

// ---- rejected files: entries -------------------------------------------------------------------

TEST(SafetensorsReader, RejectsEntryThatIsNotAnObject) {
  expect_rejected(raw_safetensors(R"({"w":[1,2]})", 0), {"tensor 'w'", "entry is an array"});
}

TEST(SafetensorsReader, RejectsMissingKey) {
  expect_rejected(one_tensor(R"({"dtype":"F32","shape":[1]})", 4), {"tensor 'w'", "missing key 'data_offsets'"});
  expect_rejected(one_tensor(R"({"shape":[1],"data_offsets":[0,4]})", 4), {"tensor 'w'", "missing key 'dtype'"});
}

TEST(SafetensorsReader, RejectsExtraKey) {
  expect_rejected(one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"offsets":[0,4]})", 4),
                  {"tensor 'w'", "unexpected key 'offsets'"});
}

TEST(SafetensorsReader, RejectsDuplicateKeyInEntry) {
  expect_rejected(one_tensor(R"({"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]})", 4),
                  {"duplicate key 'dtype'"});
}

TEST(SafetensorsReader, RejectsUnknownDtype) {
  expect_rejected(one_tensor(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})", 8),
                  {"tensor 'w'", "unknown dtype 'F64'"});
  expect_rejected(one_tensor(R"({"dtype":"bf16","shape":[1],"data_offsets":[0,2]})", 2), {"unknown dtype 'bf16'"});
  expect_rejected(one_tensor(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})", 4),
                  {"tensor 'w'", "dtype is an integer"});
}

TEST(SafetensorsReader, RejectsShapeThatIsNotAnArray) {
  expect_rejected(one_tensor(R"({"dtype":"F32","shape":4,"data_offsets":[0,16]})", 16),
                  {"tensor 'w'", "shape is an integer, expected an array"});
}

TEST(SafetensorsReader, RejectsNegativeShapeDim) {
  expect_rejected(one_tensor(R"({"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]})", 0),
                  {"tensor 'w'", "shape[1] is -1"});
}

TEST(SafetensorsReader, RejectsFloatShapeDim) {
  expect_rejected(one_tensor(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", 8),
                  {"tensor 'w'", "shape[0] is 2.0", "non-negative integer"});
  expect_rejected(one_tensor(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})", 8), {"shape[0] is \"2\""});
}

TEST(SafetensorsReader, RejectsShapeDimAboveInt64) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]})", 0),
                  {"tensor 'w'", "shape[0] is 9223372036854775808"});
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[1e30],"data_offsets":[0,0]})", 0), {"shape[0] is 1e+30"});
}

TEST(SafetensorsReader, RejectsShapeProductOverflow) {
  expect_rejected(
      one_tensor(R"({"dtype":"BF16","shape":[4294967296,4294967296,4],"data_offsets":[0,0]})", 0),
      {"tensor 'w'", "shape [4294967296,4294967296,4] is too large"});
  // Overflowing non-zero dims are rejected even when another dim is 0 (keeps every stride finite).
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]})", 0),
                  {"too large"});
}

TEST(SafetensorsReader, RejectsDataOffsetsOfWrongLength) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[0,2,4]})", 4),
                  {"tensor 'w'", "data_offsets is [0, 2, 4], expected [begin, end]"});
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":4})", 4),
                  {"data_offsets is 4, expected [begin, end]"});
}

TEST(SafetensorsReader, RejectsNegativeDataOffset) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[-4,0]})", 4),
                  {"tensor 'w'", "data_offsets [-4, 0] must be two non-negative integers"});
}

TEST(SafetensorsReader, RejectsFloatDataOffset) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4.0]})", 4),
                  {"tensor 'w'", "must be two non-negative integers"});
}

TEST(SafetensorsReader, RejectsDataOffsetAbove64Bits) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[0,18446744073709551616]})", 4),
                  {"tensor 'w'", "must be two non-negative integers"});
}

TEST(SafetensorsReader, RejectsHugeButValidLookingOffsets) {
  // 2^64-1 fits in u64: rejected by size, not by parsing, and with no overflow in end - begin.
  expect_rejected(
      one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[18446744073709551611,18446744073709551615]})", 4),
      {"tensor 'w'", "run past the end of the data section (4 bytes)"});
}

TEST(SafetensorsReader, RejectsBeginAfterEnd) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[4,0]})", 4),
                  {"tensor 'w'", "data_offsets [4, 0] have begin > end"});
}

TEST(SafetensorsReader, RejectsSizeMismatch) {
  const auto bytes = raw_safetensors(
      R"({"model.embed_tokens.weight":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,10]}})", 10);
  expect_rejected(bytes, {"tensor 'model.embed_tokens.weight'", "data_offsets [0, 10] hold 10 bytes but BF16[3,4] needs 24"});
}

TEST(SafetensorsReader, RejectsScalarWithWrongSize) {
  expect_rejected(one_tensor(R"({"dtype":"I64","shape":[],"data_offsets":[0,0]})", 0),
                  {"tensor 'w'", "hold 0 bytes but I64[] needs 8"});
}

TEST(SafetensorsReader, RejectsOffsetsPastEndOfData) {
  expect_rejected(one_tensor(R"({"dtype":"F32","shape":[6],"data_offsets":[0,24]})", 16),
                  {"tensor 'w'", "data_offsets [0, 24] run past the end of the data section (16 bytes)"});
}

// ---- rejected files: the tensors' tiling of the data section ------------------------------------

TEST(SafetensorsReader, RejectsOverlappingTensors) {
  const auto bytes = raw_safetensors(
      R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 12);
  expect_rejected(bytes, {"tensor 'b'", "overlap tensor 'a' at [0, 8]"});
}

TEST(SafetensorsReader, RejectsIdenticalRanges) {
  const auto bytes = raw_safetensors(
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4);
  expect_rejected(bytes, {"tensor 'b'", "overlap tensor 'a'"});
}

TEST(SafetensorsReader, RejectsZeroSizeTensorInsideAnother) {
  const auto bytes = raw_safetensors(
      R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})", 8);
  expect_rejected(bytes, {"tensor 'z'", "overlap tensor 'a'"});
}

TEST(SafetensorsReader, RejectsGapBetweenTensors) {
  const auto bytes = raw_safetensors(
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})", 12);
  expect_rejected(bytes, {"tensor 'b'", "gap: bytes [4, 8)"});
}

TEST(SafetensorsReader, RejectsGapAtStart) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[4,8]})", 8), {"tensor 'w'", "gap: bytes [0, 4)"});
}

TEST(SafetensorsReader, RejectsTrailingDataBytes) {
  expect_rejected(one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})", 7),
                  {"data section has 7 bytes but the tensors cover only the first 4 (3 trailing bytes)"});
}

TEST(SafetensorsReader, RejectsDataWithNoTensors) {
  expect_rejected(raw_safetensors("{}", 5), {"data section has 5 bytes", "cover only the first 0"});
}

// ---- rejected files: names and metadata --------------------------------------------------------

TEST(SafetensorsReader, RejectsDuplicateTensorNames) {
  const auto bytes = raw_safetensors(
      R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8);
  expect_rejected(bytes, {"duplicate key 'w'"});
}

TEST(SafetensorsReader, RejectsNonStringMetadataValue) {
  expect_rejected(raw_safetensors(R"({"__metadata__":{"format":"pt","step":5}})", 0),
                  {"__metadata__ value for key 'step' is an integer, expected a string"});
}

TEST(SafetensorsReader, RejectsNonObjectMetadata) {
  expect_rejected(raw_safetensors(R"({"__metadata__":["a"]})", 0), {"__metadata__ is an array"});
  expect_rejected(raw_safetensors(R"({"__metadata__":null})", 0), {"__metadata__ is null"});
}

TEST(SafetensorsReader, EscapesControlCharactersInNames) {
  const auto bytes = raw_safetensors(R"({"bad\nname":{"dtype":"U8","shape":[4],"data_offsets":[0,5]}})", 5);
  expect_rejected(bytes, {"tensor 'bad\\x0aname'"});
}

}  // namespace
}  // namespace mla::io
