// Safetensors header validation and the mmap-backed reader. Validation order follows the file:
// length prefix, UTF-8, JSON, each entry on its own, then the tensors' tiling of the data section,
// so each error names the first thing wrong in the order a person would check it.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>

#include "io/json_strict.h"

namespace mla::io {

using nlohmann::json;

namespace {

// "[3,4]" with long shapes cut, for messages.
std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i == 16) {
      s += fmt::format(",... ({} dims)", shape.size());
      break;
    }
    s += fmt::format("{}{}", i ? "," : "", shape[i]);
  }
  return s + "]";
}

// A non-negative JSON integer. nlohmann stores non-negative literals as number_unsigned, negative
// ones as number_integer, and anything that needs a fraction, an exponent or more than 64 bits as
// number_float, which is never accepted here.
std::optional<uint64_t> json_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

class HeaderParser {
 public:
  HeaderParser(std::span<const uint8_t> bytes, const std::string& file) : bytes_(bytes), file_(file) {}

  Result<ParsedHeader> parse() {
    if (bytes_.size() < 8) {
      return fail(fmt::format("file is {} bytes, shorter than the 8-byte header length prefix", bytes_.size()));
    }
    // Little-endian u64, byte by byte: independent of host endianness and alignment.
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes_[size_t(i)];
    if (n == 0) return fail("header length is 0");
    if (n > kSafetensorsMaxHeaderBytes) {
      return fail(fmt::format("header length {} exceeds the limit of {} bytes", n, kSafetensorsMaxHeaderBytes));
    }
    const uint64_t after_prefix = bytes_.size() - 8;  // no overflow: size >= 8; and 8 + n <= 8 + 1e8
    if (n > after_prefix) {
      return fail(fmt::format("header length {} runs past the end of the file ({} bytes follow the length prefix)",
                              n, after_prefix));
    }
    const std::string_view text(reinterpret_cast<const char*>(bytes_.data() + 8), size_t(n));
    if (const size_t bad = utf8_valid_prefix(text); bad != text.size()) {
      return fail(fmt::format("header is not valid UTF-8 (bad byte at header offset {})", bad));
    }
    if (text.front() != '{') return fail("header does not start with '{': expected a JSON object");
    // Real headers nest 3 deep (root, entry, shape); 64 leaves room to name the real problem.
    auto parsed = parse_json_strict(text, 64);
    if (!parsed.is_ok()) return fail("header is not valid JSON: " + parsed.status().message());
    const json& root = parsed.value();
    if (!root.is_object()) return fail(fmt::format("header is {}, expected a JSON object", json_type_phrase(root)));

    ParsedHeader h;
    h.header_size = n;
    h.data_start = 8 + n;
    h.data_size = after_prefix - n;
    h.tensors.reserve(root.size());
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it.key() == "__metadata__") {
        MLA_RETURN_IF_ERROR(parse_metadata(it.value(), h.metadata));
        continue;
      }
      MLA_ASSIGN_OR_RETURN(TensorInfo t, parse_entry(it.key(), it.value(), h.data_size));
      h.tensors.push_back(std::move(t));
    }
    MLA_RETURN_IF_ERROR(check_tiling(h.tensors, h.data_size));
    return h;
  }

 private:
  Status fail(const std::string& problem) const { return Status::error(file_ + ": " + problem); }
  Status fail_tensor(const std::string& name, const std::string& problem) const {
    return Status::error(fmt::format("{}: tensor '{}': {}", file_, printable(name), problem));
  }

  Status parse_metadata(const json& v, std::map<std::string, std::string>& out) const {
    if (!v.is_object()) {
      return fail(fmt::format("__metadata__ is {}, expected an object of strings", json_type_phrase(v)));
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!it.value().is_string()) {
        return fail(fmt::format("__metadata__ value for key '{}' is {}, expected a string", printable(it.key()),
                                json_type_phrase(it.value())));
      }
      out.emplace(it.key(), it.value().get<std::string>());
    }
    return Status::ok();
  }

  Result<TensorInfo> parse_entry(const std::string& name, const json& v, uint64_t data_size) const {
    if (!v.is_object()) {
      return fail_tensor(name, fmt::format("entry is {}, expected an object with dtype, shape and data_offsets",
                                           json_type_phrase(v)));
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& k = it.key();
      if (k != "dtype" && k != "shape" && k != "data_offsets") {
        return fail_tensor(name, fmt::format("unexpected key '{}' (allowed: dtype, shape, data_offsets)", printable(k)));
      }
    }
    for (const char* k : {"dtype", "shape", "data_offsets"}) {
      if (!v.contains(k)) return fail_tensor(name, fmt::format("missing key '{}'", k));
    }
    TensorInfo t;
    t.name = name;

    const json& dt = v["dtype"];
    if (!dt.is_string()) return fail_tensor(name, fmt::format("dtype is {}, expected a string", json_type_phrase(dt)));
    const auto dtype = dtype_from_name(dt.get_ref<const std::string&>());
    if (!dtype) {
      return fail_tensor(name, fmt::format("unknown dtype '{}' (supported: BF16, F16, F32, F8_E4M3, U8, I8, I32, I64, BOOL)",
                                           printable(dt.get_ref<const std::string&>(), 40)));
    }
    t.dtype = *dtype;

    const json& sh = v["shape"];
    if (!sh.is_array()) return fail_tensor(name, fmt::format("shape is {}, expected an array", json_type_phrase(sh)));
    t.shape.reserve(sh.size());
    for (size_t i = 0; i < sh.size(); ++i) {
      const auto d = json_u64(sh[i]);
      if (!d || *d > uint64_t(std::numeric_limits<int64_t>::max())) {
        return fail_tensor(name, fmt::format("shape[{}] is {}, expected a non-negative integer below 2^63", i,
                                             json_brief(sh[i])));
      }
      t.shape.push_back(int64_t(*d));
    }
    const auto need = tensor_byte_size(t.dtype, t.shape);
    if (!need) {
      return fail_tensor(name, fmt::format("shape {} is too large: its non-zero dims times the {}-byte {} exceed 2^62 bytes",
                                           shape_string(t.shape), dtype_size(t.dtype), dtype_name(t.dtype)));
    }

    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) {
      return fail_tensor(name, fmt::format("data_offsets is {}, expected [begin, end]", json_brief(off)));
    }
    const auto b = json_u64(off[0]);
    const auto e = json_u64(off[1]);
    if (!b || !e) {
      return fail_tensor(name, fmt::format("data_offsets {} must be two non-negative integers below 2^64", json_brief(off)));
    }
    if (*b > *e) return fail_tensor(name, fmt::format("data_offsets [{}, {}] have begin > end", *b, *e));
    t.begin = *b;
    t.end = *e;
    if (t.end - t.begin != *need) {
      return fail_tensor(name, fmt::format("data_offsets [{}, {}] hold {} bytes but {} needs {}", t.begin, t.end,
                                           t.end - t.begin, t.describe(), *need));
    }
    if (t.end > data_size) {
      return fail_tensor(name, fmt::format("data_offsets [{}, {}] run past the end of the data section ({} bytes)",
                                           t.begin, t.end, data_size));
    }
    return t;
  }

  // The tensors, sorted by offset, must tile [0, data_size): no overlap, no gap, no trailing bytes.
  Status check_tiling(std::vector<TensorInfo>& tensors, uint64_t data_size) const {
    std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    uint64_t covered = 0;  // invariant: tensors before the current one tile [0, covered)
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : tensors) {
      if (t.begin < covered) {
        return fail_tensor(t.name, fmt::format("data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", t.begin, t.end,
                                               printable(prev->name), prev->begin, prev->end));
      }
      if (t.begin > covered) {
        return fail_tensor(t.name, fmt::format("data_offsets [{}, {}] leave a gap: bytes [{}, {}) of the data section "
                                               "belong to no tensor", t.begin, t.end, covered, t.begin));
      }
      covered = t.end;
      prev = &t;
    }
    if (covered != data_size) {
      return fail(fmt::format("data section has {} bytes but the tensors cover only the first {} ({} trailing bytes)",
                              data_size, covered, data_size - covered));
    }
    return Status::ok();
  }

  std::span<const uint8_t> bytes_;
  const std::string& file_;
};

}  // namespace

std::optional<uint64_t> tensor_byte_size(DType dtype, std::span<const int64_t> shape) {
  // Overflow-checked product of the non-zero dims (bounded by 2^62, so no partial product of
  // the shape can overflow int64 downstream); a zero dim makes the tensor empty.
  uint64_t product = dtype_size(dtype);
  bool empty = false;
  for (const int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(product, uint64_t(d), &product) || product > kSafetensorsMaxTensorBytes) {
      return std::nullopt;
    }
  }
  return empty ? 0 : product;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;  // no overflow: bounded at parse time
  return n;
}

std::string TensorInfo::describe() const { return fmt::format("{}{}", dtype_name(dtype), shape_string(shape)); }

Result<ParsedHeader> parse_safetensors_header(std::span<const uint8_t> file_bytes,
                                              const std::string& file_name_for_errors) {
  try {
    return HeaderParser(file_bytes, file_name_for_errors).parse();
  } catch (const std::bad_alloc&) {
    return error("{}: out of memory while parsing the header", file_name_for_errors);
  } catch (const std::exception& e) {
    // Nothing above should throw (JSON access is type-checked first); this keeps the promise anyway.
    return error("{}: internal error while parsing the header: {}", file_name_for_errors, printable(e.what()));
  }
}

// ---- SafetensorsFile ---------------------------------------------------------------------------

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return error("{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return error("{}: not a regular file", path);
  }
  SafetensorsFile f;
  f.path_ = path;
  f.map_size_ = uint64_t(st.st_size);
  if (f.map_size_ > 0) {
    // MAP_PRIVATE + PROT_READ: no commit charge for the (possibly huge) file, and a stray write
    // through a view faults instead of corrupting the checkpoint on disk.
    void* p = ::mmap(nullptr, size_t(f.map_size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return error("{}: cannot mmap {} bytes: {}", path, f.map_size_, std::strerror(err));
    }
    f.map_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive

  auto parsed = parse_safetensors_header(std::span<const uint8_t>(f.map_, size_t(f.map_size_)), path);
  if (!parsed.is_ok()) return parsed.status();  // f's destructor unmaps
  f.header_ = std::move(parsed).value();
  f.by_name_.reserve(f.header_.tensors.size());
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.by_name_.emplace(f.header_.tensors[i].name, i);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    header_ = std::move(other.header_);
    by_name_ = std::move(other.by_name_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_t(map_size_));
  map_ = nullptr;
  map_size_ = 0;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

void SafetensorsFile::check_owns(const TensorInfo& info) const {
  // A TensorInfo from another file could point past this mapping; compare against our own entry.
  const TensorInfo* own = find(info.name);
  MLA_CHECK(own != nullptr && own->begin == info.begin && own->end == info.end && own->dtype == info.dtype &&
                own->shape == info.shape,
            "tensor '{}' is not from {}", printable(info.name), path_);
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& info) const {
  check_owns(info);
  return {map_ + header_.data_start + info.begin, size_t(info.nbytes())};
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  check_owns(info);
  MLA_CHECK(info.shape.size() <= size_t(kMaxDims), "{}: tensor '{}' has {} dims; use tensor() for ranks above {}",
            path_, printable(info.name), info.shape.size(), kMaxDims);
  // const_cast: TensorView has one pointer type for inputs and outputs; the mapping stays PROT_READ.
  void* data = const_cast<uint8_t*>(map_ + header_.data_start + info.begin);
  return TensorView::contiguous(data, info.dtype, info.shape.data(), int(info.shape.size()));
}

Result<TensorView> SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) return error("{}: no tensor '{}'", path_, printable(name));
  if (info->shape.size() > size_t(kMaxDims)) {
    return error("{}: tensor '{}': {} has {} dims, more than the {} a TensorView holds", path_, printable(name),
                 info->describe(), info->shape.size(), kMaxDims);
  }
  return view(*info);
}

bool SafetensorsFile::is_aligned(const TensorInfo& info) const {
  check_owns(info);
  const auto addr = reinterpret_cast<uintptr_t>(map_ + header_.data_start + info.begin);
  return addr % dtype_size(info.dtype) == 0;
}

}  // namespace mla::io
