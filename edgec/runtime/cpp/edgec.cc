/*
 * edgec's C++ runtime (see edgec.h): zip reading (inflate and CRC-32 by zlib), the artifact
 * checks of `edgec/runtime/artifact.py` (SHA-256 by libcrypto), signature checks of
 * `edgec/signing.py` (Ed25519 by libcrypto), and loading and running through TVM's VM.
 *
 * Messages mirror the Python runtime's word for word, so both readers refuse a file the same way.
 */
#include "edgec.h"

#include <dlfcn.h>
#include <link.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/auxv.h>
#include <sys/utsname.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

namespace edgec {
namespace ffi = tvm::ffi;

namespace {

constexpr const char* kManifestName = "manifest.json";
// An Ed25519 signature over the manifest (edgec/signing.py), checked when a key is trusted.
constexpr const char* kSignatureName = "manifest.sig";
constexpr const char* kSignatureAlgorithm = "ed25519";
// Prefixed to the manifest before signing (signing.py's CONTEXT).
constexpr const char* kSignatureContext = "edgec artifact manifest v1\n";
constexpr int kPooledAllocator = 2;
const char* const kRequiredKeys[] = {"format_version", "model", "inputs", "outputs", "libraries"};

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// ---------------------------------------------------------------------------------------------
// Inflate and CRC-32 (zlib), SHA-256 and Ed25519 (libcrypto).

// Zip's method 8, raw deflate, as Python's zipfile reads it: at most `limit` bytes (the size the
// zip declares; what follows is not read), or fewer when the stream or its input ends early (the
// CRC check then refuses them). The output grows with what inflates, so a forged size reserves
// nothing. Invalid data raises Python's zlib.error message ("Error -3 while decompressing ...").
std::vector<uint8_t> Inflate(const uint8_t* in, size_t size, size_t limit) {
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw std::bad_alloc();
  struct End {
    z_stream* stream;
    ~End() { inflateEnd(stream); }
  } end{&stream};
  std::vector<uint8_t> out;
  stream.next_in = const_cast<Bytef*>(in);
  stream.avail_in = static_cast<uInt>(size);  // a zip member's size is 32 bits
  while (out.size() < limit) {
    const size_t have = out.size(), room = std::min<size_t>(limit - have, size_t(1) << 20);
    out.resize(have + room);
    stream.next_out = out.data() + have;
    stream.avail_out = static_cast<uInt>(room);
    const int status = inflate(&stream, Z_NO_FLUSH);
    out.resize(have + room - stream.avail_out);
    if (status == Z_STREAM_END || status == Z_BUF_ERROR) break;  // ended, or its input did
    if (status == Z_MEM_ERROR) throw std::bad_alloc();
    if (status != Z_OK) {
      throw std::runtime_error("Error " + std::to_string(status) + " while decompressing data: " +
                               (stream.msg ? stream.msg : "invalid data"));
    }
    if (stream.avail_in == 0 && stream.avail_out != 0) break;
  }
  return out;
}

uint32_t Crc32(const uint8_t* data, size_t size) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0, Z_NULL, 0), data, size));
}

std::string Hex(const uint8_t* data, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 0xf];
  }
  return out;
}

// Python's bytes.fromhex: pairs of hex digits, ASCII whitespace allowed between pairs.
std::optional<std::vector<uint8_t>> FromHex(const std::string& text) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::vector<uint8_t> out;
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '\0' && std::strchr(" \t\n\r\v\f", text[i])) {
      ++i;
      continue;
    }
    if (i + 1 >= text.size()) return std::nullopt;
    int high = digit(text[i]), low = digit(text[i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    out.push_back(static_cast<uint8_t>(high << 4 | low));
    i += 2;
  }
  return out;
}

using PKey = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

// A key file's bytes (signing.py's _read_key_file).
std::vector<uint8_t> ReadKeyFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(ErrorKind::kInputFile, "public key " + Quote(path) +
                                           " does not exist; make a key pair with `edgec keygen`");
  }
  std::ifstream file(path, std::ios::binary);
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
  if (!file.is_open() || (!file.good() && !file.eof())) {
    throw Error(ErrorKind::kInputFile,
                "cannot read public key " + Quote(path) + ": " + std::strerror(errno));
  }
  return data;
}

// The name the Python side's `cryptography` gives a public key of another type.
std::string KeyTypeName(const EVP_PKEY* key) {
  switch (EVP_PKEY_get_base_id(key)) {
    case EVP_PKEY_RSA:
      return "RSAPublicKey";
    case EVP_PKEY_EC:
      return "ECPublicKey";
    case EVP_PKEY_DSA:
      return "DSAPublicKey";
    case EVP_PKEY_ED448:
      return "Ed448PublicKey";
    case EVP_PKEY_X25519:
      return "X25519PublicKey";
    case EVP_PKEY_X448:
      return "X448PublicKey";
    default:
      return std::string(EVP_PKEY_get0_type_name(key) ? EVP_PKEY_get0_type_name(key) : "key");
  }
}

// signing.py's load_public_key: 32 raw bytes, or PEM.
PKey LoadPublicKey(const TrustedKey& trusted) {
  std::string where = "the public key";
  std::vector<uint8_t> data = trusted.bytes;
  if (!trusted.file.empty()) {
    where = Quote(trusted.file);
    data = ReadKeyFile(trusted.file);
  }
  const bool pem = data.size() >= 5 && std::memcmp(data.data(), "-----", 5) == 0;
  PKey key(nullptr, EVP_PKEY_free);
  if (data.size() == 32 && !pem) {
    key.reset(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, data.data(), data.size()));
  } else if (data.size() <= static_cast<size_t>(INT32_MAX)) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(
        BIO_new_mem_buf(data.data(), static_cast<int>(data.size())), BIO_free);
    if (bio) key.reset(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  }
  ERR_clear_error();  // a failed parse leaves its reasons queued; the message below says enough
  if (!key) {
    throw Error(ErrorKind::kInputFile, where + " is not a public key (PEM or 32 raw bytes); pass "
                                               "the .pub file `edgec keygen` wrote");
  }
  if (EVP_PKEY_get_base_id(key.get()) != EVP_PKEY_ED25519) {
    throw Error(ErrorKind::kInputFile,
                where + " is a " + KeyTypeName(key.get()) + ", not an Ed25519 key");
  }
  return key;
}

// signing.py's fingerprint: the first 16 hex digits of the raw public key.
std::string Fingerprint(EVP_PKEY* key) {
  uint8_t raw[32];
  size_t size = sizeof(raw);
  if (EVP_PKEY_get_raw_public_key(key, raw, &size) != 1) return "?";
  return Hex(raw, size).substr(0, 16);
}

bool VerifyEd25519(EVP_PKEY* key, const std::vector<uint8_t>& signature,
                   const std::string& message) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  EVP_MD_CTX_free);
  if (!context) throw std::bad_alloc();
  bool valid = EVP_DigestVerifyInit(context.get(), nullptr, nullptr, nullptr, key) == 1 &&
               EVP_DigestVerify(context.get(), signature.data(), signature.size(),
                                reinterpret_cast<const uint8_t*>(message.data()),
                                message.size()) == 1;
  ERR_clear_error();
  return valid;
}

// ---------------------------------------------------------------------------------------------
// Zip archives (PKWARE APPNOTE): the central directory, then each member's local header.

uint32_t Le16(const uint8_t* p) { return p[0] | (p[1] << 8); }
uint32_t Le32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

struct CentralEntry {
  std::string name;
  std::string raw_name;  // as stored; `name` stops at a NUL
  uint32_t method, flags, crc, compressed, uncompressed, external_attr;
  size_t offset;  // of the local header; the archive's size when out of range
};

// Python zipfile's _EndRecData and _RealGetContents, so that both readers take a damaged
// archive's fields the same way: the end record is the last one in the final 64 KiB, the
// directory is the `cd_size` bytes before it (its entry count is not used), and member offsets
// shift by however far the directory moved (zipfile's "concat"). Every read is bounds-checked.
std::vector<CentralEntry> ReadCentralDirectory(const std::vector<uint8_t>& zip,
                                               const std::string& where) {
  const Error not_zip(ErrorKind::kArtifact,
                      Quote(where) + " is not an edgec artifact (not a zip archive); rebuild it");
  constexpr uint32_t kEndRecord = 0x06054b50u, kZip64Locator = 0x07064b50u;
  constexpr size_t kEndSize = 22, kEntrySize = 46;
  const size_t n = zip.size();
  if (n < kEndSize) throw not_zip;
  size_t eocd = n - kEndSize;
  if (!(Le32(&zip[eocd]) == kEndRecord && Le16(&zip[n - 2]) == 0)) {
    const size_t lowest = n > kEndSize + 65536 ? n - kEndSize - 65536 : 0;
    size_t found = std::string::npos;
    for (size_t i = n - 4 + 1; i-- > lowest;) {
      if (Le32(&zip[i]) == kEndRecord) {
        found = i;
        break;
      }
    }
    if (found == std::string::npos || found + kEndSize > n) throw not_zip;
    eocd = found;
  }
  if (eocd >= 20 && Le32(&zip[eocd - 20]) == kZip64Locator) {
    throw Error(ErrorKind::kArtifact,
                Quote(where) + " is a zip64 archive; this reader supports plain zip archives");
  }
  const uint32_t cd_size = Le32(&zip[eocd + 12]);
  const uint32_t cd_offset = Le32(&zip[eocd + 16]);
  if (cd_size > eocd) throw not_zip;  // "Bad offset for central directory"
  const size_t cd_start = eocd - cd_size;
  const int64_t concat = static_cast<int64_t>(cd_start) - cd_offset;
  std::vector<CentralEntry> entries;
  // zipfile reads the name, extra field and comment short when they run past the directory.
  auto clamp = [&](uint64_t at, uint64_t length) {
    return static_cast<size_t>(at >= eocd ? 0 : std::min<uint64_t>(length, eocd - at));
  };
  for (uint64_t p = cd_start; p < eocd;) {
    if (p + kEntrySize > eocd || Le32(&zip[p]) != 0x02014b50u) throw not_zip;
    if (zip[p + 6] > 63) throw not_zip;  // zipfile's MAX_EXTRACT_VERSION
    CentralEntry e;
    e.flags = Le16(&zip[p + 8]);
    e.method = Le16(&zip[p + 10]);
    e.crc = Le32(&zip[p + 16]);
    e.compressed = Le32(&zip[p + 20]);
    e.uncompressed = Le32(&zip[p + 24]);
    const uint64_t name_len = Le16(&zip[p + 28]), extra_len = Le16(&zip[p + 30]);
    const uint64_t comment_len = Le16(&zip[p + 32]);
    e.external_attr = Le32(&zip[p + 38]);
    const int64_t offset = static_cast<int64_t>(Le32(&zip[p + 42])) + concat;
    e.offset = offset < 0 || static_cast<uint64_t>(offset) >= n ? n : static_cast<size_t>(offset);
    const uint64_t name_at = p + kEntrySize;
    e.raw_name.assign(reinterpret_cast<const char*>(zip.data() + std::min<uint64_t>(name_at, n)),
                      clamp(name_at, name_len));
    // Python's zipfile cuts a name at its first NUL; do the same so both readers see one name.
    e.name = e.raw_name.substr(0, e.raw_name.find('\0'));
    // zipfile's _decodeExtra: each record's length must fit in the field.
    const uint64_t extra_at = name_at + name_len;
    for (size_t left = clamp(extra_at, extra_len), at = extra_at; left >= 4;) {
      const size_t record = 4 + Le16(&zip[at + 2]);
      if (record > left) throw not_zip;
      left -= record;
      at += record;
    }
    entries.push_back(std::move(e));
    p = extra_at + extra_len + comment_len;
  }
  return entries;
}

// A member's bytes, checked and read as Python's zipfile does (same messages): reads that run past
// the end of the archive come back short, and the CRC check refuses what they lack.
std::vector<uint8_t> ReadMemberData(const std::vector<uint8_t>& zip, const CentralEntry& e) {
  // 64-bit sums of 32-bit fields: no offset below can wrap.
  const uint64_t size = zip.size(), p = e.offset;
  auto available = [&](uint64_t at, uint64_t length) {
    return at >= size ? 0 : static_cast<size_t>(std::min(length, size - at));
  };
  if (p + 30 > size) throw std::runtime_error("Truncated file header");
  if (Le32(&zip[p]) != 0x04034b50u) throw std::runtime_error("Bad magic number for file header");
  const uint64_t name_at = p + 30, name_len = Le16(&zip[p + 26]);
  const uint64_t start = name_at + name_len + Le16(&zip[p + 28]);
  if (std::string(reinterpret_cast<const char*>(zip.data()) + name_at,
                  available(name_at, name_len)) != e.raw_name) {
    throw std::runtime_error("File name in directory " + Quote(e.raw_name) +
                             " and header differ.");
  }
  if (e.flags & 1) {
    throw std::runtime_error("File " + Quote(e.name) +
                             " is encrypted, password required for extraction");
  }
  const uint8_t* in = zip.data() + std::min(start, size);
  const size_t compressed = available(start, e.compressed);
  std::vector<uint8_t> data;
  if (e.method == 0) {
    data.assign(in, in + std::min<size_t>(compressed, e.uncompressed));
  } else if (e.method == 8) {
    data = Inflate(in, compressed, e.uncompressed);
  } else {
    throw std::runtime_error("That compression method is not supported");
  }
  if (Crc32(data.data(), data.size()) != e.crc) {
    throw std::runtime_error("Bad CRC-32 for file '" + e.name + "'");
  }
  if (data.size() != e.uncompressed) throw std::runtime_error("bad size for '" + e.name + "'");
  return data;
}

// The member checks of artifact.py's _check_member.
void CheckArtifactMember(const std::string& name, uint32_t external_attr,
                         const std::string& where) {
  bool escapes = name.empty() ? false : (name[0] == '/' || name[0] == '\\');
  escapes = escapes || name.find('\\') != std::string::npos || (name.size() > 1 && name[1] == ':');
  std::stringstream parts(name);
  for (std::string part; std::getline(parts, part, '/');) escapes = escapes || part == "..";
  if (escapes) {
    throw Error(ErrorKind::kArtifact, Quote(where) + " has member " + Quote(name) +
                                          " whose path escapes the archive; refusing it");
  }
  uint32_t file_type = (external_attr >> 16) & S_IFMT;
  if (file_type != 0 && file_type != S_IFREG) {
    throw Error(ErrorKind::kArtifact, Quote(where) + " has member " + Quote(name) +
                                          " that is not a plain file; refusing it");
  }
}

// ---------------------------------------------------------------------------------------------
// The manifest.

using JsonObject = ffi::Map<ffi::Any, ffi::Any>;
using JsonArray = ffi::Array<ffi::Any>;

std::optional<ffi::Any> Get(const JsonObject& object, const char* key) {
  auto it = object.find(ffi::String(key));
  if (it == object.end()) return std::nullopt;
  return (*it).second;
}

std::string GetString(const JsonObject& object, const char* key, const std::string& fallback) {
  auto value = Get(object, key);
  if (!value) return fallback;
  auto s = value->try_cast<ffi::String>();
  return s ? std::string(*s) : fallback;
}

std::vector<TensorSpec> ParseSpecs(const ffi::Any& value, const std::string& where) {
  const Error incomplete(ErrorKind::kArtifact,
                         Quote(where) + " has an incomplete manifest; rebuild it");
  auto list = value.try_cast<JsonArray>();
  if (!list) throw incomplete;
  std::vector<TensorSpec> specs;
  for (const ffi::Any& item : *list) {
    auto doc = item.try_cast<JsonObject>();
    if (!doc) throw incomplete;
    auto name = Get(*doc, "name");
    auto dtype = Get(*doc, "dtype");
    auto dims = Get(*doc, "dims");
    if (!name || !dtype || !dims) throw incomplete;
    TensorSpec spec;
    auto name_s = name->try_cast<ffi::String>();
    auto dtype_s = dtype->try_cast<ffi::String>();
    auto dims_a = dims->try_cast<JsonArray>();
    if (!name_s || !dtype_s || !dims_a) throw incomplete;
    spec.name = *name_s;
    spec.dtype = *dtype_s;
    for (const ffi::Any& d : *dims_a) {
      Dim dim;
      if (d.type_index() == ffi::TypeIndex::kTVMFFIInt) {
        dim.value = d.cast<int64_t>();
      } else if (auto symbol = d.try_cast<ffi::String>()) {
        dim.symbol = *symbol;
      } else {
        throw incomplete;
      }
      spec.dims.push_back(dim);
    }
    if (auto fixed = Get(*doc, "fixed")) {
      auto fixed_doc = fixed->try_cast<JsonObject>();
      if (!fixed_doc) throw incomplete;
      auto shape = Get(*fixed_doc, "shape");
      auto values = Get(*fixed_doc, "value");
      if (!shape || !values) throw incomplete;
      auto shape_a = shape->try_cast<JsonArray>();
      auto values_a = values->try_cast<JsonArray>();
      if (!shape_a || !values_a) throw incomplete;
      spec.fixed = true;
      for (const ffi::Any& d : *shape_a) spec.fixed_shape.push_back(d.cast<int64_t>());
      for (const ffi::Any& v : *values_a) {
        if (v.type_index() == ffi::TypeIndex::kTVMFFIFloat) {
          spec.fixed_floats.push_back(v.cast<double>());
          spec.fixed_ints.push_back(0);
        } else if (v.type_index() == ffi::TypeIndex::kTVMFFIBool) {
          spec.fixed_ints.push_back(v.cast<bool>() ? 1 : 0);
          spec.fixed_floats.push_back(spec.fixed_ints.back());
        } else {
          spec.fixed_ints.push_back(v.cast<int64_t>());
          spec.fixed_floats.push_back(static_cast<double>(spec.fixed_ints.back()));
        }
      }
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

// Python's repr of a list of dims: [1, 'seq', 16].
std::string DimsRepr(const std::vector<Dim>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    out += (i ? ", " : "") +
           (dims[i].symbolic() ? Quote(dims[i].symbol) : std::to_string(dims[i].value));
  }
  return out + "]";
}

std::string ShapeRepr(const int64_t* shape, int ndim) {
  std::string out = "[";
  for (int i = 0; i < ndim; ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

// One input as the checks see it.
struct Given {
  std::string name;
  DLDataType dtype;
  const int64_t* shape;
  int ndim;
  const void* data;
};

// Element i of a given input as int64 (ints, bools) or double (floats).
bool ReadElement(const Given& g, int64_t i, int64_t* as_int, double* as_float) {
  const uint8_t* p = static_cast<const uint8_t*>(g.data) + i * ((g.dtype.bits + 7) / 8);
  switch (g.dtype.code) {
    case kDLInt:
      if (g.dtype.bits == 64) *as_int = *reinterpret_cast<const int64_t*>(p);
      else if (g.dtype.bits == 32) *as_int = *reinterpret_cast<const int32_t*>(p);
      else if (g.dtype.bits == 16) *as_int = *reinterpret_cast<const int16_t*>(p);
      else if (g.dtype.bits == 8) *as_int = *reinterpret_cast<const int8_t*>(p);
      else return false;
      *as_float = static_cast<double>(*as_int);
      return true;
    case kDLUInt:
      if (g.dtype.bits == 64) *as_int = static_cast<int64_t>(*reinterpret_cast<const uint64_t*>(p));
      else if (g.dtype.bits == 32) *as_int = *reinterpret_cast<const uint32_t*>(p);
      else if (g.dtype.bits == 16) *as_int = *reinterpret_cast<const uint16_t*>(p);
      else if (g.dtype.bits == 8 || g.dtype.bits == 1) *as_int = *p;
      else return false;
      *as_float = static_cast<double>(*as_int);
      return true;
    case kDLBool:
      *as_int = *p != 0;
      *as_float = static_cast<double>(*as_int);
      return true;
    case kDLFloat:
      if (g.dtype.bits == 64) *as_float = *reinterpret_cast<const double*>(p);
      else if (g.dtype.bits == 32) *as_float = *reinterpret_cast<const float*>(p);
      else return false;
      *as_int = 0;
      return true;
    default:
      return false;
  }
}

std::string FixedRepr(const std::vector<int64_t>& ints, const std::vector<double>& floats,
                      bool is_float) {
  std::string out = "[";
  for (size_t i = 0; i < ints.size() && i < 8; ++i) {
    char buffer[32];
    if (is_float) std::snprintf(buffer, sizeof(buffer), "%g", floats[i]);
    else std::snprintf(buffer, sizeof(buffer), "%lld", static_cast<long long>(ints[i]));
    out += (i ? ", " : "") + std::string(buffer);
  }
  return out + (ints.size() > 8 ? ", ...]" : "]");
}

// signature.py's check of an input the artifact was compiled for one value of.
void CheckFixed(const TensorSpec& spec, const Given& g, const std::string& where) {
  if (!spec.fixed) return;
  bool is_float = g.dtype.code == kDLFloat;
  bool same = static_cast<size_t>(g.ndim) == spec.fixed_shape.size() &&
              std::equal(spec.fixed_shape.begin(), spec.fixed_shape.end(), g.shape);
  int64_t count = 1;
  for (int i = 0; i < g.ndim; ++i) count *= g.shape[i];
  std::vector<int64_t> ints(count);
  std::vector<double> floats(count);
  for (int64_t i = 0; i < count; ++i) {
    if (!ReadElement(g, i, &ints[i], &floats[i])) {
      throw Error(ErrorKind::kSamples, where + ": input " + Quote(spec.name) +
                                           " has a dtype this host cannot compare");
    }
  }
  same = same && static_cast<size_t>(count) == spec.fixed_ints.size();
  for (int64_t i = 0; same && i < count; ++i) {
    same = is_float ? floats[i] == spec.fixed_floats[i] : ints[i] == spec.fixed_ints[i];
  }
  if (!same) {
    throw Error(ErrorKind::kSamples,
                where + ": input " + Quote(spec.name) + " is " + FixedRepr(ints, floats, is_float) +
                    ", the artifact was compiled for " +
                    FixedRepr(spec.fixed_ints, spec.fixed_floats, is_float) +
                    " (its value in every profiled sample); recompile with samples that cover "
                    "this value");
  }
}

// signature.py's bind_inputs: names, dtypes, ranks, fixed dims, shared symbols.
void BindInputs(const std::vector<TensorSpec>& specs, const std::vector<Given>& given,
                const std::string& where) {
  std::map<std::string, const Given*> by_name;
  for (const Given& g : given) {
    if (!by_name.emplace(g.name, &g).second) {
      throw Error(ErrorKind::kSamples, where + ": input " + Quote(g.name) + " is given twice");
    }
  }
  std::vector<std::string> expected, missing, extra;
  std::set<std::string> expected_set;
  for (const TensorSpec& spec : specs) {
    expected.push_back(spec.name);
    expected_set.insert(spec.name);
    if (!by_name.count(spec.name)) missing.push_back(spec.name);
  }
  for (const auto& kv : by_name) {
    if (!expected_set.count(kv.first)) extra.push_back(kv.first);  // std::map: sorted
  }
  if (!missing.empty() || !extra.empty()) {
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back("missing " + Join(missing));
    if (!extra.empty()) parts.push_back("unexpected " + Join(extra));
    std::string joined = parts.size() == 2 ? parts[0] + "; " + parts[1] : parts[0];
    throw Error(ErrorKind::kSamples,
                where + ": " + joined + "; the model's inputs are " + Join(expected));
  }
  std::map<std::string, int64_t> bound;
  for (const TensorSpec& spec : specs) {
    const Given& g = *by_name[spec.name];
    std::string dtype;
    try {
      dtype = DTypeName(g.dtype);
    } catch (const Error&) {
      dtype = "an unsupported dtype";
    }
    if (dtype != spec.dtype) {
      throw Error(ErrorKind::kSamples, where + ": input " + Quote(spec.name) + " is " + dtype +
                                           ", the model expects " + spec.dtype +
                                           "; convert it first (numpy: .astype('" + spec.dtype +
                                           "'))");
    }
    if (static_cast<size_t>(g.ndim) != spec.dims.size()) {
      throw Error(ErrorKind::kSamples,
                  where + ": input " + Quote(spec.name) + " has rank " + std::to_string(g.ndim) +
                      " (shape " + ShapeRepr(g.shape, g.ndim) + "), the model expects rank " +
                      std::to_string(spec.dims.size()) + " " + DimsRepr(spec.dims));
    }
    for (int axis = 0; axis < g.ndim; ++axis) {
      const Dim& dim = spec.dims[axis];
      int64_t size = g.shape[axis];
      if (!dim.symbolic()) {
        if (dim.value != size) {
          throw Error(ErrorKind::kSamples,
                      where + ": input " + Quote(spec.name) + " has " + std::to_string(size) +
                          " at axis " + std::to_string(axis) + ", the model fixes it to " +
                          std::to_string(dim.value) + " (shape " + DimsRepr(spec.dims) + ")");
        }
      } else {
        auto it = bound.emplace(dim.symbol, size).first;
        if (it->second != size) {
          throw Error(ErrorKind::kSamples, where + ": dim " + Quote(dim.symbol) + " is " +
                                               std::to_string(it->second) + " in one input and " +
                                               std::to_string(size) + " in " + Quote(spec.name) +
                                               " axis " + std::to_string(axis) +
                                               "; inputs sharing a dim name must agree");
        }
      }
    }
    CheckFixed(spec, g, where);
  }
}

// Python's repr() of a scalar JSON value, as artifact.py's messages print it.
std::string PyRepr(const ffi::Any& value) {
  if (auto s = value.try_cast<ffi::String>()) return Quote(std::string(*s));
  switch (value.type_index()) {
    case ffi::TypeIndex::kTVMFFINone:
      return "None";
    case ffi::TypeIndex::kTVMFFIBool:
      return value.cast<bool>() ? "True" : "False";
    default:
      return std::string(ffi::json::Stringify(value));
  }
}

// errors.py's describe(): the last meaningful line of a foreign error, without a backtrace.
std::string Describe(const std::exception& exc) {
  std::string text = exc.what();
  if (const auto* ffi_error = dynamic_cast<const ffi::Error*>(&exc)) {
    text = ffi_error->message();  // as Python's str() of the error: no kind
  }
  std::string last;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    line = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
    if (line.rfind("File ", 0) == 0 || line.rfind("Stack trace", 0) == 0 ||
        line.rfind("[bt]", 0) == 0 || std::isdigit(static_cast<unsigned char>(line[0]))) {
      continue;
    }
    last = line;
  }
  return (last.empty() ? std::string("error") : last).substr(0, 300);
}

struct AlignedAlloc {
  void AllocData(DLTensor* tensor) {
    size_t size = std::max<size_t>(ffi::GetDataSize(*tensor), 1);
    void* data = nullptr;
    if (posix_memalign(&data, kAlignment, size) != 0) throw std::bad_alloc();
    tensor->data = data;
  }
  void FreeData(DLTensor* tensor) { free(tensor->data); }
};

// The directory libtvm_runtime.so was loaded from, or "" (it is loaded with the program).
int FindRuntimeDir(struct dl_phdr_info* info, size_t, void* data) {
  std::string name = info->dlpi_name ? info->dlpi_name : "";
  const std::string library = "/libtvm_runtime.so";
  if (name.size() > library.size() &&
      name.compare(name.size() - library.size(), library.size(), library) == 0) {
    *static_cast<std::string*>(data) = name.substr(0, name.size() - library.size());
    return 1;
  }
  return 0;
}

// Load libtvm_runtime_extra.so (sort/top-k and random kernels that compiled TopK, ArgSort and
// random ops call) when it sits beside libtvm_runtime.so, as the Python runtime does. Optional:
// the host links only libtvm_runtime and libtvm_ffi, and models without those ops never need it.
void LoadRuntimeExtra() {
  static const bool done = [] {
    std::string dir;
    dl_iterate_phdr(FindRuntimeDir, &dir);
    std::string extra = dir + "/libtvm_runtime_extra.so";
    if (!dir.empty() && access(extra.c_str(), R_OK) == 0) {
      dlopen(extra.c_str(), RTLD_NOW | RTLD_GLOBAL);  // kept for the process's lifetime
    }
    return true;
  }();
  (void)done;
}

int DefaultThreads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string FileName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// -------------------------------------------------------------------------------------------------

std::vector<ZipMember> ReadZip(const std::vector<uint8_t>& archive, const std::string& where,
                               void (*check_member)(const std::string&, uint32_t,
                                                    const std::string&)) {
  std::vector<CentralEntry> entries = ReadCentralDirectory(archive, where);
  if (check_member) {
    for (const CentralEntry& e : entries) check_member(e.name, e.external_attr, where);
  }
  std::vector<ZipMember> members;
  for (const CentralEntry& e : entries) {
    try {
      members.push_back({e.name, e.external_attr, ReadMemberData(archive, e)});
    } catch (const std::runtime_error& exc) {
      if (dynamic_cast<const Error*>(&exc)) throw;
      throw Error(ErrorKind::kArtifact,
                  Quote(where) + " is corrupt (" + exc.what() + "); rebuild it");
    }
  }
  return members;
}

std::string Sha256Hex(const uint8_t* data, size_t size) {
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, size, digest, &length, EVP_sha256(), nullptr) != 1) {
    ERR_clear_error();
    throw std::runtime_error("libcrypto cannot compute SHA-256");
  }
  return Hex(digest, length);
}

namespace {
std::set<std::string> HostCpuFeatures() {
#if defined(__aarch64__)
  // The kernel's hwcaps, which qemu-user also emulates (its /proc/cpuinfo is the host's).
  // Bits from the arm64 ABI (asm/hwcap.h), named as /proc/cpuinfo names them.
  static const std::pair<const char*, unsigned long> kHwcap[] = {
      {"fp", 1UL << 0}, {"asimd", 1UL << 1}, {"aes", 1UL << 3}, {"crc32", 1UL << 7},
      {"atomics", 1UL << 8}, {"fphp", 1UL << 9}, {"asimdhp", 1UL << 10},
      {"asimdrdm", 1UL << 12}, {"asimddp", 1UL << 20}, {"sve", 1UL << 22}};
  static const std::pair<const char*, unsigned long> kHwcap2[] = {
      {"i8mm", 1UL << 13}, {"bf16", 1UL << 14}, {"sve2", 1UL << 1}};
  std::set<std::string> features;
  unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  for (const auto& [name, bit] : kHwcap) if (hwcap & bit) features.insert(name);
  for (const auto& [name, bit] : kHwcap2) if (hwcap2 & bit) features.insert(name);
  return features;
#else
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    std::string key = line.substr(0, line.find(':'));
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key == "flags" || key == "Features") {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> features;
      for (std::string word; words >> word;) features.insert(word);
      return features;
    }
  }
  return {};
#endif
}

// Features a library needs that this CPU lacks (none when built for another arch).
std::vector<std::string> MissingFeatures(const LibraryInfo& info) {
  std::vector<std::string> missing;
  if (info.cpu_features.empty() || info.arch != HostArch()) return missing;
  std::set<std::string> have = HostCpuFeatures();
  for (const std::string& feature : info.cpu_features) {
    if (!have.count(feature)) missing.push_back(feature);
  }
  return missing;
}
}  // namespace

std::string HostArch() {
  struct utsname name;
  if (uname(&name) != 0) return "unknown";
  std::string machine = name.machine;
  for (char& c : machine) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (machine == "amd64") return "x86_64";
  if (machine == "arm64") return "aarch64";
  return machine;
}

namespace {
// numpy's dtype names and their DLPack form (numpy's own DLPack export uses these).
const std::vector<std::pair<std::string, DLDataType>>& KnownDTypes() {
  static const std::vector<std::pair<std::string, DLDataType>> known = {
      {"bool", {kDLBool, 8, 1}},        {"float16", {kDLFloat, 16, 1}},
      {"float32", {kDLFloat, 32, 1}},   {"float64", {kDLFloat, 64, 1}},
      {"bfloat16", {kDLBfloat, 16, 1}}, {"int8", {kDLInt, 8, 1}},
      {"int16", {kDLInt, 16, 1}},       {"int32", {kDLInt, 32, 1}},
      {"int64", {kDLInt, 64, 1}},       {"uint8", {kDLUInt, 8, 1}},
      {"uint16", {kDLUInt, 16, 1}},     {"uint32", {kDLUInt, 32, 1}},
      {"uint64", {kDLUInt, 64, 1}}};
  return known;
}
}  // namespace

std::string DTypeName(DLDataType dtype) {
  for (const auto& [name, known] : KnownDTypes()) {
    if (dtype.code == known.code && dtype.bits == known.bits && dtype.lanes == known.lanes) {
      return name;
    }
  }
  if (dtype.code == kDLUInt && dtype.bits == 1 && dtype.lanes == 1) return "bool";  // TVM's bool
  throw Error(ErrorKind::kSamples, "unsupported dtype (code " + std::to_string(dtype.code) +
                                       ", bits " + std::to_string(dtype.bits) + ", lanes " +
                                       std::to_string(dtype.lanes) + ")");
}

DLDataType ParseDType(const std::string& name) {
  for (const auto& [known_name, dtype] : KnownDTypes()) {
    if (known_name == name) return dtype;
  }
  throw Error(ErrorKind::kSamples, "unknown dtype " + Quote(name));
}

ffi::Tensor Empty(const std::vector<int64_t>& shape, DLDataType dtype) {
  return ffi::Tensor::FromNDAlloc(AlignedAlloc(), ffi::ShapeView(shape.data(), shape.size()), dtype,
                                  DLDevice{kDLCPU, 0});
}

Artifact Artifact::Open(const std::string& path, const TrustedKey& require_signature) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(ErrorKind::kInputFile,
                "artifact " + Quote(path) + " does not exist; build one with `edgec compile`");
  }
  std::ifstream file(path, std::ios::binary);
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
  if (!file.good() && !file.eof()) {
    throw Error(ErrorKind::kInputFile, "cannot read artifact " + Quote(path));
  }
  Artifact artifact = FromBytes(data, path);
  if (!require_signature.empty()) artifact.VerifySignature(require_signature);
  return artifact;
}

Artifact Artifact::FromBytes(const std::vector<uint8_t>& data, const std::string& where) {
  const std::string w = Quote(where);
  std::vector<CentralEntry> entries = ReadCentralDirectory(data, where);
  std::set<std::string> names;
  for (const CentralEntry& e : entries) {
    CheckArtifactMember(e.name, e.external_attr, where);
    names.insert(e.name);
  }
  if (names.size() != entries.size()) {
    throw Error(ErrorKind::kArtifact,
                w + " holds duplicate member names; the file was tampered with");
  }
  if (!names.count(kManifestName)) {
    throw Error(ErrorKind::kArtifact,
                w + " has no " + kManifestName + "; it is not an edgec artifact");
  }
  Artifact artifact;
  artifact.where_ = where;
  std::map<std::string, size_t> index;  // member name -> position in files_
  try {
    for (const CentralEntry& e : entries) {
      std::vector<uint8_t> bytes = ReadMemberData(data, e);
      if (e.name == kManifestName) {
        artifact.manifest_json_.assign(bytes.begin(), bytes.end());
      } else if (e.name == kSignatureName) {
        artifact.is_signed_ = true;
        artifact.signature_.assign(bytes.begin(), bytes.end());
      } else {
        index[e.name] = artifact.files_.size();
        artifact.files_.push_back({e.name, e.external_attr, std::move(bytes)});
      }
    }
  } catch (const std::runtime_error& exc) {
    throw Error(ErrorKind::kArtifact, w + " is corrupt (" + exc.what() + "); rebuild it");
  }
  ffi::String parse_error;
  ffi::Any doc = ffi::json::Parse(artifact.manifest_json_, &parse_error);
  if (!parse_error.empty()) {
    throw Error(ErrorKind::kArtifact,
                w + " is corrupt (" + std::string(parse_error) + "); rebuild it");
  }
  // check_manifest
  const Error incomplete(ErrorKind::kArtifact, w + " has an incomplete manifest; rebuild it");
  auto manifest = doc.try_cast<JsonObject>();
  if (!manifest) throw incomplete;
  for (const char* key : kRequiredKeys) {
    if (!Get(*manifest, key)) throw incomplete;
  }
  ffi::Any version = *Get(*manifest, "format_version");
  if (version.type_index() != ffi::TypeIndex::kTVMFFIInt) {
    throw Error(ErrorKind::kArtifact,
                w + " has an invalid format_version " + PyRepr(version) + "; rebuild it");
  }
  int64_t v = version.cast<int64_t>();
  if (v > kFormatVersion) {
    throw Error(ErrorKind::kArtifact, w + " is artifact format " + std::to_string(v) +
                                          ", this runtime reads up to " +
                                          std::to_string(kFormatVersion) + "; upgrade edgec");
  }
  if (v < 1) {
    throw Error(ErrorKind::kArtifact,
                w + " has an invalid format_version " + std::to_string(v) + "; rebuild it");
  }
  artifact.format_version_ = static_cast<int>(v);
  if (Get(*manifest, "boundary")) {
    // Sequence and optional inputs/outputs map to tensors in the Python runtime only.
    throw Error(ErrorKind::kArtifact,
                w + " takes or returns sequences or optionals, which this C++ runtime does not "
                    "map; run it with the Python runtime (edgec.runtime) or export a model with "
                    "tensor inputs and outputs");
  }
  auto libraries = Get(*manifest, "libraries")->try_cast<JsonObject>();
  if (!libraries || libraries->empty()) {
    throw Error(ErrorKind::kArtifact, w + " lists no libraries; rebuild it");
  }
  std::set<std::string> listed;
  for (const auto& kv : *libraries) {
    auto target = kv.first.try_cast<ffi::String>();
    if (!target) throw incomplete;
    auto entry = kv.second.try_cast<JsonObject>();
    LibraryInfo info;
    info.target = *target;
    if (entry) {
      info.file = GetString(*entry, "file", "");
      info.sha256 = GetString(*entry, "sha256", "");
      info.arch = GetString(*entry, "arch", "");
      info.device = GetString(*entry, "device", "cpu");
      if (auto parallel = entry->Get("tvm_kernels_parallel")) {
        if (auto flag = parallel->try_cast<bool>()) info.tvm_kernels_parallel = *flag;
      }
      if (auto count = entry->Get("threads")) {
        if (auto value = count->try_cast<int64_t>()) info.threads = static_cast<int>(*value);
      }
      info.vm_exec_mode = GetString(*entry, "vm_exec_mode", "bytecode");
      if (auto linked = entry->Get("linked_functions")) {
        if (auto list = linked->try_cast<JsonArray>()) {
          for (const ffi::Any& name : *list) {
            if (auto text = name.try_cast<ffi::String>()) info.linked_functions.push_back(*text);
          }
        }
      }
      if (auto features = entry->Get("cpu_features")) {
        if (auto list = features->try_cast<JsonArray>()) {
          for (const ffi::Any& feature : *list) {
            if (auto name = feature.try_cast<ffi::String>()) info.cpu_features.push_back(*name);
          }
        }
      }
    }
    if (info.file.empty() || !index.count(info.file)) {
      throw Error(ErrorKind::kArtifact,
                  w + ": the library for target " + Quote(info.target) + " is missing; rebuild it");
    }
    const std::vector<uint8_t>& bytes = artifact.files_[index[info.file]].data;
    if (Sha256Hex(bytes.data(), bytes.size()) != info.sha256) {
      throw Error(ErrorKind::kArtifact,
                  w + ": checksum mismatch for " + Quote(info.file) + " (target " +
                      Quote(info.target) +
                      "); the artifact is corrupt or was modified, rebuild it");
    }
    listed.insert(info.file);
    artifact.libraries_.push_back(std::move(info));
  }
  std::vector<std::string> unlisted;
  for (const auto& kv : index) {  // sorted, as Python's sorted()
    if (!listed.count(kv.first)) unlisted.push_back(kv.first);
  }
  if (!unlisted.empty()) {
    throw Error(ErrorKind::kArtifact,
                w + " holds members the manifest does not list: " + Join(unlisted));
  }
  artifact.inputs_ = ParseSpecs(*Get(*manifest, "inputs"), where);
  artifact.outputs_ = ParseSpecs(*Get(*manifest, "outputs"), where);
  return artifact;
}

namespace {
// Python's str() of a JSON scalar, as signing.py's messages print it.
std::string PyStr(const ffi::Any& value) {
  if (auto s = value.try_cast<ffi::String>()) return std::string(*s);
  return PyRepr(value);
}
}  // namespace

void Artifact::VerifySignature(const TrustedKey& trusted) const {
  const std::string w = Quote(where_);
  PKey key = LoadPublicKey(trusted);  // first, as signing.py: a bad key is named before all else
  const std::string fingerprint = Fingerprint(key.get());
  if (!is_signed_) {
    throw Error(ErrorKind::kArtifact, w + " is not signed, and a signature by key " + fingerprint +
                                          " is required; rebuild it with `edgec compile --sign KEY`");
  }
  const Error malformed(ErrorKind::kArtifact, w + " has a malformed signature; the artifact was "
                                                  "modified, rebuild and sign it again");
  ffi::String parse_error;
  ffi::Any doc;
  try {
    doc = ffi::json::Parse(signature_, &parse_error);
  } catch (const std::exception&) {
    throw malformed;
  }
  auto document = doc.try_cast<JsonObject>();
  if (!parse_error.empty() || !document) throw malformed;
  auto algorithm = Get(*document, "algorithm");
  if (!algorithm) throw malformed;
  auto algorithm_name = algorithm->try_cast<ffi::String>();
  if (!algorithm_name || std::string(*algorithm_name) != kSignatureAlgorithm) {
    throw Error(ErrorKind::kArtifact, w + " is signed with " + Quote(PyStr(*algorithm)) +
                                          ", this edgec verifies only " + kSignatureAlgorithm);
  }
  auto signature_hex = Get(*document, "signature");
  if (!signature_hex) throw malformed;
  auto signature_text = signature_hex->try_cast<ffi::String>();
  if (!signature_text) throw malformed;
  std::optional<std::vector<uint8_t>> signature = FromHex(std::string(*signature_text));
  if (!signature) throw malformed;
  auto signer_key = Get(*document, "public_key");
  const std::string signer = signer_key ? PyStr(*signer_key).substr(0, 16) : "";
  if (!VerifyEd25519(key.get(), *signature, kSignatureContext + manifest_json_)) {
    if (!signer.empty() && signer != fingerprint) {
      throw Error(ErrorKind::kArtifact, w + " is signed by key " + signer +
                                            ", not by the required key " + fingerprint +
                                            "; refusing it");
    }
    throw Error(ErrorKind::kArtifact, w + " has an invalid signature for key " + fingerprint +
                                          ": its manifest was modified after signing; refusing it");
  }
}

const std::vector<uint8_t>& Artifact::library(const std::string& target) const {
  for (const LibraryInfo& info : libraries_) {
    if (info.target != target) continue;
    for (const ZipMember& member : files_) {
      if (member.name == info.file) return member.data;
    }
  }
  SelectTarget(target);  // throws the "no library for target" message
  throw Error(ErrorKind::kArtifact, Quote(where_) + ": no library for " + Quote(target));
}

std::string Artifact::SelectTarget(const std::string& target) const {
  std::vector<std::string> names, available;
  for (const LibraryInfo& info : libraries_) {
    names.push_back(info.target);
    available.push_back(info.target + " (" + info.arch + ")");
  }
  if (!target.empty()) {
    if (std::find(names.begin(), names.end(), target) == names.end()) {
      throw Error(ErrorKind::kArtifact, Quote(where_) + " has no library for target " +
                                            Quote(target) + "; it has " + Join(names));
    }
    for (const LibraryInfo& info : libraries_) {
      std::vector<std::string> missing = info.target == target ? MissingFeatures(info)
                                                                : std::vector<std::string>{};
      if (!missing.empty()) {
        throw Error(ErrorKind::kArtifact, Quote(where_) + ": the " + Quote(target) +
                                              " library needs CPU features this CPU lacks: " +
                                              Join(missing) + "; pick another target");
      }
    }
    return target;
  }
  const std::string arch = HostArch();
  for (const LibraryInfo& info : libraries_) {
    if (info.arch == arch && info.device == "cpu" && MissingFeatures(info).empty()) return info.target;
  }
  throw Error(ErrorKind::kArtifact, Quote(where_) + " has no library for this machine (" + arch +
                                        "); it has " + Join(available) +
                                        "; rebuild with a target for " + arch);
}

// A library built with vm_exec_mode "compiled" runs its Relax functions as native code, which
// finds the functions edgec links into it (oneDNN shim, NonZero...) only among the library
// module's imports or in the global registry, and caches them in the module. Each is registered
// just long enough for the library to look it up, then the registry is restored; the function
// wraps the symbol without a reference to the library (no cycle through its own cache).
// The Python runtime does the same (edgec/runtime/linked.py).
void BindLinkedFunctions(const std::string& lib_path, const LibraryInfo& library,
                         const std::string& where) {
  if (library.vm_exec_mode != "compiled" || library.linked_functions.empty()) return;
  // Another reference to the copy just loaded, not a second copy.
  void* handle = dlopen(lib_path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!handle) {
    throw Error(ErrorKind::kArtifact, "the library of " + Quote(where) + " is not loaded");
  }
  struct Closer {
    void* handle;
    ~Closer() { dlclose(handle); }
  } closer{handle};
  void** context = reinterpret_cast<void**>(dlsym(handle, "__tvm_ffi__library_ctx"));
  if (!context || !*context) {
    throw Error(ErrorKind::kArtifact, "the library of " + Quote(where) +
                                          " has no module context; rebuild the artifact");
  }
  static std::mutex mutex;
  for (const std::string& name : library.linked_functions) {
    auto call = reinterpret_cast<TVMFFISafeCallType>(dlsym(handle, ("__tvm_ffi_" + name).c_str()));
    if (!call) {
      throw Error(ErrorKind::kArtifact, "artifact " + Quote(where) + " calls " + Quote(name) +
                                            ", which its library does not contain; rebuild the "
                                            "artifact with this edgec");
    }
    ffi::Function function = ffi::Function::FromExternC(nullptr, call, nullptr);
    std::lock_guard<std::mutex> lock(mutex);
    std::optional<ffi::Function> previous = ffi::Function::GetGlobal(name);
    ffi::Function::SetGlobal(name, function, true);
    TVMFFIObjectHandle found = nullptr;
    int status = TVMFFIEnvModLookupFromImports(*context, name.c_str(), &found);
    if (previous) {
      ffi::Function::SetGlobal(name, *previous, true);
    } else {
      ffi::Function::RemoveGlobal(name);
    }
    if (status != 0) {
      throw Error(ErrorKind::kArtifact, "binding " + Quote(name) + " into the library of " +
                                            Quote(where) + " failed; rebuild the artifact");
    }
  }
}

Model Model::Load(const std::string& path, const std::string& target, int threads) {
  return Load(Artifact::Open(path), target, threads);
}

Model Model::Load(const std::string& path, const LoadOptions& options) {
  return Load(Artifact::Open(path, options.require_signature), options.target, options.threads);
}

Model Model::Load(const Artifact& artifact, const std::string& target, int threads) {
  Model model;
  model.where_ = artifact.where();
  model.target_ = artifact.SelectTarget(target);
  model.inputs_ = artifact.inputs();
  model.outputs_ = artifact.outputs();
  // The VM's thread pool reads this once, when it starts; it otherwise runs one thread. A
  // library whose TVM kernels are serial gets one (same rule as the Python runtime).
  const LibraryInfo* library = nullptr;
  for (const LibraryInfo& info : artifact.libraries()) {
    if (info.target == model.target_) library = &info;
  }
  bool parallel = library->tvm_kernels_parallel;
  if (threads <= 0) threads = library->threads;  // the plan's choice unless the caller names one
  setenv("TVM_NUM_THREADS",
         std::to_string(!parallel ? 1 : threads > 0 ? threads : DefaultThreads()).c_str(), 0);
  // oneDNN's OpenMP threads (libgomp reads these when the model library loads it): as many as
  // the VM's, spinning a bounded while between kernels and then sleeping. Spinning forever made a
  // small CNN 550x slower on a busy 2-core machine; sleeping at once paid a wake-up per kernel
  // (shufflenet 8.6 against 3.9 ms). Same count as the Python runtime's OMP_SPIN_COUNT.
  setenv("OMP_NUM_THREADS", std::to_string(threads > 0 ? threads : DefaultThreads()).c_str(), 0);
  if (!getenv("OMP_WAIT_POLICY")) setenv("GOMP_SPINCOUNT", "10000", 0);
  LoadRuntimeExtra();
  const std::vector<uint8_t>& bytes = artifact.library(model.target_);
  const char* tmp_env = getenv("TMPDIR");
  std::string dir_template = std::string(tmp_env && *tmp_env ? tmp_env : "/tmp") + "/edgec-XXXXXX";
  std::vector<char> dir_buffer(dir_template.begin(), dir_template.end());
  dir_buffer.push_back('\0');
  if (!mkdtemp(dir_buffer.data())) {
    throw Error(ErrorKind::kToolchain, "cannot create a temporary directory under " +
                                           dir_template.substr(0, dir_template.size() - 13));
  }
  const std::string dir = dir_buffer.data();
  // A fixed name: the target name comes from the manifest and must not pick the path.
  const std::string lib_path = dir + "/model.so";
  auto cleanup = [&] {
    unlink(lib_path.c_str());
    rmdir(dir.c_str());
  };
  try {
    {
      std::ofstream out(lib_path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
      if (!out) throw std::runtime_error("cannot write " + lib_path);
    }
    model.library_ = ffi::Module::LoadFromFile(lib_path);
    BindLinkedFunctions(lib_path, *library, model.where_);
  } catch (const Error&) {
    cleanup();
    throw;
  } catch (const std::exception& exc) {
    cleanup();
    throw Error(ErrorKind::kArtifact, "cannot load the " + Quote(model.target_) + " library of " +
                                          Quote(model.where_) + ": " + Describe(exc));
  }
  cleanup();
  ffi::Optional<ffi::Function> load_exec = model.library_->GetFunction("vm_load_executable");
  if (!load_exec) {
    throw Error(ErrorKind::kArtifact, "the " + Quote(model.target_) + " library of " +
                                          Quote(model.where_) + " is not a TVM VM executable");
  }
  model.vm_ = (*load_exec)().cast<ffi::Module>();
  ffi::Function init = model.vm_->GetFunction("vm_initialization").value();
  init(static_cast<int>(kDLCPU), 0, kPooledAllocator);
  model.main_ = model.vm_->GetFunction("main").value();
  return model;
}

std::vector<ffi::Tensor> Model::Run(const std::vector<Input>& inputs) const {
  std::vector<Given> given;
  for (const Input& in : inputs) {
    given.push_back({in.name, in.dtype, in.shape.data(), static_cast<int>(in.shape.size()), in.data});
  }
  BindInputs(inputs_, given, "inputs to " + Quote(FileName(where_)));
  std::vector<ffi::Tensor> args;
  for (const TensorSpec& spec : inputs_) {
    const Input& in = *std::find_if(inputs.begin(), inputs.end(),
                                    [&](const Input& i) { return i.name == spec.name; });
    ffi::Tensor tensor = Empty(in.shape, in.dtype);
    std::memcpy(tensor.data_ptr(), in.data, ffi::GetDataSize(tensor));
    args.push_back(std::move(tensor));
  }
  return CallChecked(args);
}

std::vector<ffi::Tensor> Model::Run(const std::vector<ffi::Tensor>& args) const {
  const std::string where = "inputs to " + Quote(FileName(where_));
  if (args.size() != inputs_.size()) {
    throw Error(ErrorKind::kSamples, where + ": " + std::to_string(args.size()) +
                                         " tensors given, the model takes " +
                                         std::to_string(inputs_.size()));
  }
  std::vector<Given> given;
  for (size_t i = 0; i < args.size(); ++i) {
    const DLTensor& t = *args[i].GetDLTensorPtr();
    if (t.device.device_type != kDLCPU || !args[i].IsContiguous() ||
        !args[i].IsAligned(kAlignment)) {
      throw Error(ErrorKind::kSamples,
                  where + ": input " + Quote(inputs_[i].name) +
                      " must be a contiguous CPU tensor aligned to 64 bytes (use edgec::Empty)");
    }
    given.push_back({inputs_[i].name, t.dtype, t.shape, t.ndim,
                     static_cast<const uint8_t*>(t.data) + t.byte_offset});
  }
  BindInputs(inputs_, given, where);
  return CallChecked(args);
}

std::vector<ffi::Tensor> Model::CallChecked(const std::vector<ffi::Tensor>& args) const {
  std::vector<ffi::Tensor> outputs = Flatten(RawCall(args));
  if (outputs.size() != outputs_.size()) {
    throw Error(ErrorKind::kArtifact,
                Quote(where_) + " returned " + std::to_string(outputs.size()) +
                    " outputs, its manifest lists " + std::to_string(outputs_.size()));
  }
  return outputs;
}

ffi::Any Model::RawCall(const std::vector<ffi::Tensor>& args) const {
  std::vector<ffi::AnyView> views(args.begin(), args.end());
  ffi::Any result;
  main_.CallPacked(views.data(), static_cast<int32_t>(views.size()), &result);
  return result;
}

std::vector<ffi::Tensor> Model::Flatten(const ffi::Any& result) {
  std::vector<ffi::Tensor> out;
  if (auto tensor = result.try_cast<ffi::Tensor>()) {
    out.push_back(*tensor);
  } else if (auto array = result.try_cast<ffi::Array<ffi::Any>>()) {
    for (const ffi::Any& item : *array) {
      std::vector<ffi::Tensor> inner = Flatten(item);
      out.insert(out.end(), inner.begin(), inner.end());
    }
  } else {
    throw Error(ErrorKind::kArtifact,
                "the model returned a " + result.GetTypeKey() + ", not tensors");
  }
  return out;
}

}  // namespace edgec
