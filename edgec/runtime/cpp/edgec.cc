/*
 * edgec's C++ runtime (see edgec.h): zip reading with a small inflate, SHA-256 and CRC-32, the
 * artifact checks of `edgec/runtime/artifact.py`, and loading and running through TVM's VM.
 *
 * Messages mirror the Python runtime's word for word, so both readers refuse a file the same way.
 */
#include "edgec.h"

#include <dlfcn.h>
#include <link.h>
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

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

namespace edgec {
namespace ffi = tvm::ffi;

namespace {

constexpr const char* kManifestName = "manifest.json";
// An Ed25519 signature over the manifest (edgec/signing.py); this host does not verify it.
constexpr const char* kSignatureName = "manifest.sig";
constexpr int kPooledAllocator = 2;
const char* const kRequiredKeys[] = {"format_version", "model", "inputs", "outputs", "libraries"};

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// ---------------------------------------------------------------------------------------------
// Inflate (RFC 1951), after Mark Adler's puff.c: canonical Huffman codes decoded bit by bit.

class Inflater {
 public:
  // Inflates into `out`, which must not grow beyond `limit` bytes (the size the zip declares).
  Inflater(const uint8_t* in, size_t size, size_t limit, std::vector<uint8_t>* out)
      : in_(in), size_(size), limit_(limit), out_(out) {}

  void Run() {
    int last;
    do {
      last = Bits(1);
      int type = Bits(2);
      if (type == 0) {
        Stored();
      } else if (type == 1) {
        Fixed();
      } else if (type == 2) {
        Dynamic();
      } else {
        throw std::runtime_error("invalid deflate block type");
      }
    } while (!last);
  }

 private:
  static constexpr int kMaxBits = 15;
  static constexpr int kMaxLengthCodes = 286;
  static constexpr int kMaxDistCodes = 30;
  static constexpr int kFixedLengthCodes = 288;

  struct Huffman {
    int16_t count[kMaxBits + 1];
    int16_t symbol[kFixedLengthCodes];
  };

  int Bits(int need) {
    uint32_t value = bitbuf_;
    while (bitcnt_ < need) {
      if (pos_ == size_) throw std::runtime_error("deflate data ends early");
      value |= static_cast<uint32_t>(in_[pos_++]) << bitcnt_;
      bitcnt_ += 8;
    }
    bitbuf_ = value >> need;
    bitcnt_ -= need;
    return static_cast<int>(value & ((1u << need) - 1));
  }

  void Stored() {
    bitbuf_ = 0;
    bitcnt_ = 0;
    if (pos_ + 4 > size_) throw std::runtime_error("deflate data ends early");
    unsigned len = in_[pos_] | (in_[pos_ + 1] << 8);
    unsigned nlen = in_[pos_ + 2] | (in_[pos_ + 3] << 8);
    pos_ += 4;
    if (len != (~nlen & 0xffffu)) throw std::runtime_error("bad stored block length");
    if (pos_ + len > size_) throw std::runtime_error("deflate data ends early");
    if (out_->size() + len > limit_) throw std::runtime_error("deflate data longer than declared");
    out_->insert(out_->end(), in_ + pos_, in_ + pos_ + len);
    pos_ += len;
  }

  // The symbol of the next code; the fast form of puff's decode(), bits taken from bitbuf_.
  int Decode(const Huffman& h) {
    uint32_t bitbuf = bitbuf_;
    int left = bitcnt_;
    int code = 0, first = 0, index = 0, len = 1;
    const int16_t* next = h.count + 1;
    for (;;) {
      while (left--) {
        code |= bitbuf & 1;
        bitbuf >>= 1;
        int count = *next++;
        if (code - count < first) {
          bitbuf_ = bitbuf;
          bitcnt_ = (bitcnt_ - len) & 7;
          return h.symbol[index + (code - first)];
        }
        index += count;
        first += count;
        first <<= 1;
        code <<= 1;
        ++len;
      }
      left = (kMaxBits + 1) - len;
      if (left == 0) break;
      if (pos_ == size_) throw std::runtime_error("deflate data ends early");
      bitbuf = in_[pos_++];
      if (left > 8) left = 8;
    }
    throw std::runtime_error("invalid Huffman code");
  }

  // Build a canonical code from code lengths; returns 0 when complete, > 0 when incomplete,
  // < 0 when over-subscribed.
  static int Construct(Huffman* h, const int16_t* length, int n) {
    std::fill(h->count, h->count + kMaxBits + 1, 0);
    for (int s = 0; s < n; ++s) h->count[length[s]]++;
    if (h->count[0] == n) return 0;
    int left = 1;
    for (int len = 1; len <= kMaxBits; ++len) {
      left <<= 1;
      left -= h->count[len];
      if (left < 0) return left;
    }
    int16_t offs[kMaxBits + 1];
    offs[1] = 0;
    for (int len = 1; len < kMaxBits; ++len) offs[len + 1] = offs[len] + h->count[len];
    for (int s = 0; s < n; ++s) {
      if (length[s] != 0) h->symbol[offs[length[s]]++] = static_cast<int16_t>(s);
    }
    return left;
  }

  void Codes(const Huffman& lencode, const Huffman& distcode) {
    static const int16_t kLengthBase[29] = {3,  4,  5,  6,   7,   8,   9,   10,  11, 13,
                                            15, 17, 19, 23,  27,  31,  35,  43,  51, 59,
                                            67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const int16_t kLengthExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                             2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    static const int16_t kDistBase[30] = {
        1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
        193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    static const int16_t kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                           6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
    for (;;) {
      int symbol = Decode(lencode);
      if (symbol < 256) {
        if (out_->size() == limit_) throw std::runtime_error("deflate data longer than declared");
        out_->push_back(static_cast<uint8_t>(symbol));
        continue;
      }
      if (symbol == 256) return;
      symbol -= 257;
      if (symbol >= 29) throw std::runtime_error("invalid deflate length code");
      size_t len = kLengthBase[symbol] + Bits(kLengthExtra[symbol]);
      symbol = Decode(distcode);
      if (symbol >= 30) throw std::runtime_error("invalid deflate distance code");
      size_t dist = kDistBase[symbol] + Bits(kDistExtra[symbol]);
      if (dist > out_->size()) throw std::runtime_error("deflate distance too far back");
      if (out_->size() + len > limit_)
        throw std::runtime_error("deflate data longer than declared");
      size_t from = out_->size() - dist;
      for (size_t i = 0; i < len; ++i) out_->push_back((*out_)[from + i]);
    }
  }

  void Fixed() {
    if (!fixed_built_) {
      int16_t lengths[kFixedLengthCodes];
      int s = 0;
      for (; s < 144; ++s) lengths[s] = 8;
      for (; s < 256; ++s) lengths[s] = 9;
      for (; s < 280; ++s) lengths[s] = 7;
      for (; s < kFixedLengthCodes; ++s) lengths[s] = 8;
      Construct(&fixed_len_, lengths, kFixedLengthCodes);
      for (s = 0; s < kMaxDistCodes; ++s) lengths[s] = 5;
      Construct(&fixed_dist_, lengths, kMaxDistCodes);
      fixed_built_ = true;
    }
    Codes(fixed_len_, fixed_dist_);
  }

  void Dynamic() {
    static const int16_t kOrder[19] = {16, 17, 18, 0, 8,  7, 9,  6, 10, 5,
                                       11, 4,  12, 3, 13, 2, 14, 1, 15};
    int nlen = Bits(5) + 257;
    int ndist = Bits(5) + 1;
    int ncode = Bits(4) + 4;
    if (nlen > kMaxLengthCodes || ndist > kMaxDistCodes) {
      throw std::runtime_error("bad deflate code counts");
    }
    int16_t lengths[kMaxLengthCodes + kMaxDistCodes] = {0};
    for (int i = 0; i < ncode; ++i) lengths[kOrder[i]] = static_cast<int16_t>(Bits(3));
    Huffman lencode, distcode;
    if (Construct(&lencode, lengths, 19) != 0) throw std::runtime_error("bad deflate code lengths");
    int index = 0;
    while (index < nlen + ndist) {
      int symbol = Decode(lencode);
      if (symbol < 16) {
        lengths[index++] = static_cast<int16_t>(symbol);
        continue;
      }
      int16_t len = 0;
      if (symbol == 16) {
        if (index == 0) throw std::runtime_error("deflate repeat with no first length");
        len = lengths[index - 1];
        symbol = 3 + Bits(2);
      } else if (symbol == 17) {
        symbol = 3 + Bits(3);
      } else {
        symbol = 11 + Bits(7);
      }
      if (index + symbol > nlen + ndist) throw std::runtime_error("too many deflate lengths");
      while (symbol--) lengths[index++] = len;
    }
    if (lengths[256] == 0) throw std::runtime_error("deflate block has no end code");
    int err = Construct(&lencode, lengths, nlen);
    if (err && (err < 0 || nlen != lencode.count[0] + lencode.count[1])) {
      throw std::runtime_error("incomplete deflate literal/length code");
    }
    err = Construct(&distcode, lengths + nlen, ndist);
    if (err && (err < 0 || ndist != distcode.count[0] + distcode.count[1])) {
      throw std::runtime_error("incomplete deflate distance code");
    }
    Codes(lencode, distcode);
  }

  const uint8_t* in_;
  size_t size_;
  size_t limit_;
  size_t pos_ = 0;
  uint32_t bitbuf_ = 0;
  int bitcnt_ = 0;
  std::vector<uint8_t>* out_;
  Huffman fixed_len_, fixed_dist_;
  bool fixed_built_ = false;
};

// ---------------------------------------------------------------------------------------------
// CRC-32 (zip's) and SHA-256 (FIPS 180-4).

uint32_t Crc32(const uint8_t* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

class Sha256 {
 public:
  void Update(const uint8_t* data, size_t size) {
    total_ += size;
    if (used_ > 0) {
      size_t take = std::min(size, sizeof(block_) - used_);
      std::memcpy(block_ + used_, data, take);
      used_ += take;
      data += take;
      size -= take;
      if (used_ < sizeof(block_)) return;
      Compress(block_);
      used_ = 0;
    }
    for (; size >= 64; data += 64, size -= 64) Compress(data);
    std::memcpy(block_, data, size);
    used_ = size;
  }

  std::string HexDigest() {
    uint64_t bits = total_ * 8;
    uint8_t pad[72] = {0x80};
    size_t pad_len = (used_ < 56 ? 56 - used_ : 120 - used_);
    for (int i = 0; i < 8; ++i) pad[pad_len + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    Update(pad, pad_len + 8);
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (uint32_t word : state_) {
      for (int shift = 28; shift >= 0; shift -= 4) out += hex[(word >> shift) & 0xf];
    }
    return out;
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void Compress(const uint8_t* chunk) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t(chunk[4 * i]) << 24) | (uint32_t(chunk[4 * i + 1]) << 16) |
             (uint32_t(chunk[4 * i + 2]) << 8) | uint32_t(chunk[4 * i + 3]);
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t s1 = Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25);
      uint32_t t1 = h + s1 + ((e & f) ^ (~e & g)) + k[i] + w[i];
      uint32_t s0 = Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22);
      uint32_t t2 = s0 + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
  }

  uint32_t state_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Zip archives (PKWARE APPNOTE): the central directory, then each member's local header.

uint32_t Le16(const uint8_t* p) { return p[0] | (p[1] << 8); }
uint32_t Le32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

struct CentralEntry {
  std::string name;
  uint32_t method, flags, crc, compressed, uncompressed, external_attr, offset;
};

std::vector<CentralEntry> ReadCentralDirectory(const std::vector<uint8_t>& zip,
                                               const std::string& where) {
  const Error not_zip(ErrorKind::kArtifact,
                      Quote(where) + " is not an edgec artifact (not a zip archive); rebuild it");
  const size_t n = zip.size();
  if (n < 22) throw not_zip;
  size_t eocd = std::string::npos;
  size_t lowest = n > 22 + 65535 ? n - 22 - 65535 : 0;
  for (size_t i = n - 22 + 1; i-- > lowest;) {
    if (Le32(&zip[i]) == 0x06054b50u && i + 22 + Le16(&zip[i + 20]) == n) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) throw not_zip;
  uint32_t count = Le16(&zip[eocd + 10]);
  uint32_t cd_size = Le32(&zip[eocd + 12]);
  uint32_t cd_offset = Le32(&zip[eocd + 16]);
  if (count == 0xffffu || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
    throw Error(ErrorKind::kArtifact,
                Quote(where) + " is a zip64 archive; this reader supports plain zip archives");
  }
  if (static_cast<uint64_t>(cd_offset) + cd_size > eocd) throw not_zip;
  std::vector<CentralEntry> entries;
  size_t p = cd_offset;
  for (uint32_t i = 0; i < count; ++i) {
    if (p + 46 > eocd || Le32(&zip[p]) != 0x02014b50u) throw not_zip;
    CentralEntry e;
    e.flags = Le16(&zip[p + 8]);
    e.method = Le16(&zip[p + 10]);
    e.crc = Le32(&zip[p + 16]);
    e.compressed = Le32(&zip[p + 20]);
    e.uncompressed = Le32(&zip[p + 24]);
    uint32_t name_len = Le16(&zip[p + 28]);
    uint32_t extra_len = Le16(&zip[p + 30]);
    uint32_t comment_len = Le16(&zip[p + 32]);
    e.external_attr = Le32(&zip[p + 38]);
    e.offset = Le32(&zip[p + 42]);
    if (p + 46 + name_len + extra_len + comment_len > eocd) throw not_zip;
    e.name.assign(reinterpret_cast<const char*>(&zip[p + 46]), name_len);
    // Python's zipfile cuts a name at its first NUL; do the same so both readers see one name.
    e.name = e.name.substr(0, e.name.find('\0'));
    entries.push_back(std::move(e));
    p += 46 + name_len + extra_len + comment_len;
  }
  return entries;
}

std::vector<uint8_t> ReadMemberData(const std::vector<uint8_t>& zip, const CentralEntry& e) {
  if (e.flags & 1) throw std::runtime_error("member '" + e.name + "' is encrypted");
  size_t p = e.offset;
  if (p + 30 > zip.size() || Le32(&zip[p]) != 0x04034b50u) {
    throw std::runtime_error("bad local header for '" + e.name + "'");
  }
  size_t start = p + 30 + Le16(&zip[p + 26]) + Le16(&zip[p + 28]);
  if (start + e.compressed > zip.size()) throw std::runtime_error("'" + e.name + "' is truncated");
  std::vector<uint8_t> data;
  if (e.method == 0) {
    if (e.compressed != e.uncompressed) throw std::runtime_error("bad size for '" + e.name + "'");
    data.assign(zip.begin() + start, zip.begin() + start + e.compressed);
  } else if (e.method == 8) {
    // Deflate expands at most 1032:1: a forged size must not reserve gigabytes.
    data.reserve(std::min<size_t>(e.uncompressed, size_t(e.compressed) * 1032 + 64));
    Inflater(zip.data() + start, e.compressed, e.uncompressed, &data).Run();
    if (data.size() != e.uncompressed) throw std::runtime_error("bad size for '" + e.name + "'");
  } else {
    throw std::runtime_error("compression method " + std::to_string(e.method) + " of '" + e.name +
                             "' is not supported");
  }
  if (Crc32(data.data(), data.size()) != e.crc) {
    throw std::runtime_error("Bad CRC-32 for file '" + e.name + "'");
  }
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
  Sha256 sha;
  sha.Update(data, size);
  return sha.HexDigest();
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

Artifact Artifact::Open(const std::string& path) {
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
  return FromBytes(data, path);
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
    if (!listed.count(kv.first) && kv.first != kSignatureName) unlisted.push_back(kv.first);
  }
  if (!unlisted.empty()) {
    throw Error(ErrorKind::kArtifact,
                w + " holds members the manifest does not list: " + Join(unlisted));
  }
  artifact.inputs_ = ParseSpecs(*Get(*manifest, "inputs"), where);
  artifact.outputs_ = ParseSpecs(*Get(*manifest, "outputs"), where);
  return artifact;
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
