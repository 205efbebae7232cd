// Checkpoint directories: sharded and single-file round trips through ShardedCheckpointWriter,
// and index errors (missing shard, tensor not in its shard, escaping paths, duplicates).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "safetensors_test_util.h"

namespace mla::io {
namespace {

namespace fs = std::filesystem;
using test_util::raw_safetensors;
using test_util::random_bytes;
using test_util::TempDir;
using test_util::write_bytes;

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<Spec> make_specs() {
  // Sizes in bytes: 24, 40, 4, 96, 0, 12 (total 176); every dtype size class, an empty tensor.
  std::vector<Spec> specs = {
      {"model.embed_tokens.weight", DType::BF16, {3, 4}, {}},
      {"model.layers.0.mlp.gate.weight", DType::F32, {2, 5}, {}},
      {"model.layers.0.input_layernorm.weight", DType::F16, {2}, {}},
      {"model.layers.0.self_attn.q_a_proj.weight", DType::F8_E4M3, {8, 12}, {}},
      {"model.layers.0.empty", DType::I64, {0}, {}},
      {"lm_head.weight", DType::I32, {3}, {}},
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t n = dtype_size(specs[i].dtype);
    for (int64_t d : specs[i].shape) n *= size_t(d);
    specs[i].bytes = random_bytes(n, 7 + i);
  }
  return specs;
}

void add_all(ShardedCheckpointWriter& w, const std::vector<Spec>& specs) {
  for (const Spec& s : specs) {
    w.add(s.name, s.dtype, s.shape, [&s](std::span<uint8_t> out) {
      ASSERT_EQ(out.size(), s.bytes.size());
      std::copy(s.bytes.begin(), s.bytes.end(), out.begin());
    });
  }
}

void expect_contents(const Checkpoint& ckpt, const std::vector<Spec>& specs) {
  std::vector<std::string> names;
  uint64_t total = 0;
  for (const Spec& s : specs) {
    names.push_back(s.name);
    total += s.bytes.size();
    auto v = ckpt.get(s.name);
    ASSERT_TRUE(v.is_ok()) << v.status().message();
    EXPECT_EQ(v->dtype, s.dtype);
    ASSERT_EQ(size_t(v->ndim), s.shape.size());
    for (size_t d = 0; d < s.shape.size(); ++d) EXPECT_EQ(v->dim(int(d)), s.shape[d]);
    EXPECT_EQ(v->nbytes(), s.bytes.size());
    if (!s.bytes.empty()) {
      EXPECT_EQ(std::memcmp(v->data, s.bytes.data(), s.bytes.size()), 0) << s.name;
    }
    EXPECT_TRUE(ckpt.contains(s.name));
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(ckpt.tensor_names(), names);
  EXPECT_EQ(ckpt.total_bytes(), total);
  EXPECT_EQ(ckpt.num_tensors(), specs.size());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good());
}

// A valid one-tensor shard holding U8[4] `name`.
void write_shard(const std::string& path, const std::string& name) {
  write_bytes(path, raw_safetensors(
                        fmt::format(R"({{"{}":{{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}}})", name), 4));
}

void expect_open_error(const TempDir& dir, std::initializer_list<std::string_view> needles) {
  auto c = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(c.is_ok()) << "checkpoint was accepted";
  const std::string msg = c.status().message();
  for (std::string_view needle : needles) {
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
  }
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(Checkpoint, ShardedRoundTrip) {
  TempDir dir;
  const auto specs = make_specs();
  ShardedCheckpointWriter w(/*max_shard_bytes=*/64);
  add_all(w, specs);
  w.set_metadata({{"format", "pt"}});
  uint64_t last_done = 0, last_total = 0;
  w.set_progress([&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
  });
  ASSERT_TRUE(w.write(dir.path().string()).is_ok());
  // Greedy packing of 24,40 | 4 | 96 | 0,12 under a 64-byte limit: a lone 96-byte tensor gets its own shard.
  const std::vector<std::string> want_files = {
      "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
      "model-00004-of-00004.safetensors"};
  EXPECT_EQ(w.written_files(), want_files);
  EXPECT_EQ(last_done, 176u);
  EXPECT_EQ(last_total, 176u);
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));

  // The index, read independently of the loader.
  std::ifstream in(dir.file("model.safetensors.index.json"));
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 176u);
  EXPECT_EQ(index["weight_map"].size(), specs.size());
  EXPECT_EQ(index["weight_map"]["model.layers.0.self_attn.q_a_proj.weight"], "model-00003-of-00004.safetensors");

  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->files().size(), 4u);
  expect_contents(*ckpt, specs);
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = ckpt->find("lm_head.weight", &file);
  ASSERT_NE(info, nullptr);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(fs::path(file->path()).filename(), "model-00004-of-00004.safetensors");
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(ckpt->find("nope"), nullptr);
  auto missing = ckpt->get("nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
}

TEST(Checkpoint, SingleFileWhenEverythingFits) {
  TempDir dir;
  const auto specs = make_specs();
  // A stale index from an earlier sharded write must not win over the new single file.
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"gone.safetensors"}})");
  ShardedCheckpointWriter w(/*max_shard_bytes=*/1 << 20);
  add_all(w, specs);
  ASSERT_TRUE(w.write(dir.path().string()).is_ok());
  EXPECT_EQ(w.written_files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->files().size(), 1u);
  expect_contents(*ckpt, specs);
}

TEST(Checkpoint, ForcedShardingWritesIndexForOneShard) {
  TempDir dir;
  const auto specs = make_specs();
  ShardedCheckpointWriter w(/*max_shard_bytes=*/1 << 20, /*force_sharding=*/true);
  add_all(w, specs);
  ASSERT_TRUE(w.write(dir.path().string()).is_ok());
  EXPECT_EQ(w.written_files(), std::vector<std::string>{"model-00001-of-00001.safetensors"});
  EXPECT_TRUE(fs::exists(dir.file("model.safetensors.index.json")));
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  expect_contents(*ckpt, specs);
}

TEST(Checkpoint, SharedShardIsOpenedOnce) {
  TempDir dir;
  write_bytes(dir.file("s.safetensors"),
              raw_safetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4));
  write_text(dir.file("model.safetensors.index.json"),
             R"({"metadata":{},"weight_map":{"a":"s.safetensors","b":"./s.safetensors"}})");
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->files().size(), 1u);
  EXPECT_EQ(ckpt->tensor_names(), (std::vector<std::string>{"a", "b"}));
}

TEST(Checkpoint, RejectsEmptyDirectory) {
  TempDir dir;
  expect_open_error(dir, {dir.path().string(), "model.safetensors.index.json", "model.safetensors"});
}

TEST(Checkpoint, RejectsMissingDirectory) {
  TempDir dir;
  auto c = Checkpoint::open(dir.file("absent"));
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("absent"), std::string::npos);
}

TEST(Checkpoint, PropagatesBadSingleFile) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), raw_safetensors(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,3]}})", 3));
  expect_open_error(dir, {"model.safetensors", "tensor 'w'", "hold 3 bytes but U8[4] needs 4"});
}

TEST(Checkpoint, RejectsMissingShard) {
  TempDir dir;
  write_shard(dir.file("model-00001-of-00002.safetensors"), "a");
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  expect_open_error(dir, {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "cannot open"});
}

TEST(Checkpoint, RejectsTensorMissingFromItsShard) {
  TempDir dir;
  write_shard(dir.file("s1.safetensors"), "a");
  write_shard(dir.file("s2.safetensors"), "b");
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})");
  expect_open_error(dir, {"model.safetensors.index.json", "tensor 'c'", "s2.safetensors", "no such tensor"});
}

TEST(Checkpoint, RejectsParentDirectoryEscape) {
  TempDir dir;
  fs::create_directory(dir.path() / "model");
  write_shard(dir.file("x.safetensors"), "a");  // exists, but outside the model directory
  write_text((dir.path() / "model" / "model.safetensors.index.json").string(), R"({"weight_map":{"a":"../x.safetensors"}})");
  auto c = Checkpoint::open((dir.path() / "model").string());
  ASSERT_FALSE(c.is_ok());
  const std::string msg = c.status().message();
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'../x.safetensors'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("leave the model directory"), std::string::npos) << msg;
}

TEST(Checkpoint, RejectsAbsoluteShardPath) {
  TempDir dir;
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"/etc/passwd"}})");
  expect_open_error(dir, {"model.safetensors.index.json", "'/etc/passwd'", "absolute paths are not allowed"});
}

TEST(Checkpoint, RejectsSymlinkOutOfDirectory) {
  TempDir dir;
  fs::create_directory(dir.path() / "model");
  write_shard(dir.file("outside.safetensors"), "a");
  fs::create_symlink(dir.path() / "outside.safetensors", dir.path() / "model" / "link.safetensors");
  write_text((dir.path() / "model" / "model.safetensors.index.json").string(), R"({"weight_map":{"a":"link.safetensors"}})");
  auto c = Checkpoint::open((dir.path() / "model").string());
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("outside the model directory"), std::string::npos) << c.status().message();
}

TEST(Checkpoint, AcceptsSymlinkWithinDirectory) {
  TempDir dir;
  fs::create_directories(dir.path() / "blobs");
  write_shard(dir.file("blobs/abc123"), "a");
  fs::create_symlink(dir.path() / "blobs" / "abc123", dir.path() / "model.safetensors");
  auto c = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_TRUE(c->contains("a"));
}

TEST(Checkpoint, RejectsTensorInTwoShards) {
  TempDir dir;
  write_shard(dir.file("s1.safetensors"), "dup.weight");
  write_bytes(dir.file("s2.safetensors"),
              raw_safetensors(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                              R"("dup.weight":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4));
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map":{"dup.weight":"s1.safetensors","b":"s2.safetensors"}})");
  expect_open_error(dir, {"tensor 'dup.weight' is in two shards", "s1.safetensors", "s2.safetensors"});
}

TEST(Checkpoint, RejectsMalformedIndex) {
  {
    TempDir dir;
    write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
    expect_open_error(dir, {"model.safetensors.index.json", "not valid JSON"});
  }
  {
    TempDir dir;
    write_text(dir.file("model.safetensors.index.json"), R"({"metadata":{}})");
    expect_open_error(dir, {"model.safetensors.index.json", "missing key 'weight_map'"});
  }
  {
    TempDir dir;
    write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":3}})");
    expect_open_error(dir, {"model.safetensors.index.json", "tensor 'a'", "is an integer, expected a file name"});
  }
  {
    TempDir dir;
    write_shard(dir.file("s.safetensors"), "a");
    write_text(dir.file("model.safetensors.index.json"),
               R"({"weight_map":{"a":"s.safetensors","a":"s.safetensors"}})");
    expect_open_error(dir, {"model.safetensors.index.json", "duplicate key 'a'"});
  }
}

}  // namespace
}  // namespace mla::io
