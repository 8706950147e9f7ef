/*
 * edgec's C++ runtime: open an `.edgec` artifact, verify it, load the library for this machine
 * and run the model's `main` through TVM's VM.
 *
 * It reads the same format as the Python loader (`edgec/runtime/artifact.py`, format version 1)
 * and refuses the same files with the same one-line messages: format version, member paths,
 * duplicate or unlisted members, CRC-32 and sha256 of every library and, when the caller names a
 * trusted key, the Ed25519 signature (`edgec/signing.py`), all checked before any native code is
 * loaded. It needs `libtvm_runtime.so`, `libtvm_ffi.so` and tvm_ffi's headers
 * (`tvm_ffi.libinfo.find_include_path()`), zlib (inflate, CRC-32) and OpenSSL 3's libcrypto
 * (SHA-256, Ed25519).
 *
 *     edgec::Model model = edgec::Model::Load("model.edgec");
 *     std::vector<tvm::ffi::Tensor> outputs = model.Run({{"image", dtype, {1, 3, 32, 32}, data}});
 *
 *     edgec::LoadOptions options;
 *     options.require_signature.file = "builder.pub";  // as `edgec keygen` wrote it
 *     edgec::Model signed_model = edgec::Model::Load("model.edgec", options);
 *
 * Errors a user can cause throw edgec::Error, whose exit_code() matches `edgec/errors.py`;
 * failures inside the model (a wrong shape caught by the VM) throw tvm::ffi::Error.
 */
#ifndef EDGEC_RUNTIME_EDGEC_H_
#define EDGEC_RUNTIME_EDGEC_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace edgec {

/*! \brief The newest artifact format version this reader understands. */
constexpr int kFormatVersion = 1;
/*! \brief TVM's kernels use aligned vector loads: inputs must start at this byte boundary. */
constexpr size_t kAlignment = 64;

/*! \brief What went wrong; the values are `edgec/errors.py`'s exit codes. */
enum class ErrorKind : int { kInputFile = 3, kSamples = 5, kArtifact = 7, kToolchain = 9 };

/*! \brief An error caused by the user's input or environment, with a one-line message. */
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }

 private:
  ErrorKind kind_;
};

/*! \brief A dim of a model input or output: a fixed size, or a symbol shared between inputs. */
struct Dim {
  int64_t value = -1;
  std::string symbol;  // non-empty for a symbolic dim
  bool symbolic() const { return !symbol.empty(); }
};

/*! \brief A model input or output as the manifest records it (dtype as numpy names it). */
struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<Dim> dims;
  // A shape-like input compiled for one value (the manifest's "fixed"): a call must pass exactly
  // that value. Integer and bool values are compared as int64, floats as double.
  bool fixed = false;
  std::vector<int64_t> fixed_shape;
  std::vector<int64_t> fixed_ints;
  std::vector<double> fixed_floats;
};

/*! \brief One library of an artifact, in manifest order. */
struct LibraryInfo {
  std::string target;
  std::string file;
  std::string sha256;
  std::string arch;
  std::string device;
  bool tvm_kernels_parallel = true;  // false: TVM's kernels are serial, its pool gets one thread
  int threads = 0;  // the plan's count, used when the caller names none (0: every core)
  // "compiled": the VM runs native code, which needs linked_functions bound at load.
  std::string vm_exec_mode = "bytecode";
  std::vector<std::string> linked_functions;
  std::vector<std::string> cpu_features;  // as /proc/cpuinfo names them; checked before loading
};

/*! \brief One member of a zip archive, read and CRC-checked. */
struct ZipMember {
  std::string name;
  uint32_t external_attr = 0;
  std::vector<uint8_t> data;
};

/*!
 * \brief Every member of a zip archive (stored or deflated), in archive order.
 * \param check_member called with each name and external_attr before any data is read; it may
 * throw. \throws Error(kArtifact) naming `where` when the archive is malformed or a CRC does not
 * match.
 */
std::vector<ZipMember> ReadZip(const std::vector<uint8_t>& archive, const std::string& where,
                               void (*check_member)(const std::string& name, uint32_t external_attr,
                                                    const std::string& where) = nullptr);

/*! \brief The lowercase hex SHA-256 of a byte range. */
std::string Sha256Hex(const uint8_t* data, size_t size);

/*!
 * \brief The Ed25519 public key an artifact must be signed by, as `edgec run --require-signature`
 * takes it: a key file, or the key's bytes. Either holds PEM (SubjectPublicKeyInfo, the `.pub`
 * that `edgec keygen` or `openssl pkey -pubout` writes) or the 32 raw bytes of the key.
 * Both empty: no signature is required.
 */
struct TrustedKey {
  std::string file;
  std::vector<uint8_t> bytes;
  bool empty() const { return file.empty() && bytes.empty(); }
};

/*! \brief How Model::Load picks and checks what it loads. */
struct LoadOptions {
  std::string target;  // "": the first CPU library for this host
  int threads = 0;     // see Model::Load
  // Refuse the artifact unless it carries a valid signature by this key (edgec/signing.py).
  TrustedKey require_signature;
};

/*! \brief This machine's architecture as artifacts name it (`x86_64`, `aarch64`). */
std::string HostArch();

/*! \brief numpy's name of a DLPack dtype (`float32`, `int64`, `bool`); throws for others. */
std::string DTypeName(DLDataType dtype);
/*! \brief The DLPack dtype of a numpy dtype name; throws Error(kSamples) for unknown names. */
DLDataType ParseDType(const std::string& name);

/*! \brief A CPU tensor whose data starts at a kAlignment boundary (contents uninitialized). */
tvm::ffi::Tensor Empty(const std::vector<int64_t>& shape, DLDataType dtype);

/*! \brief A verified artifact in memory; nothing native is loaded. */
class Artifact {
 public:
  /*!
   * \brief Read and verify the artifact at `path` and, unless `require_signature` is empty, its
   * signature by that key; throws Error naming what is wrong (Python's open_artifact).
   */
  static Artifact Open(const std::string& path, const TrustedKey& require_signature = {});
  /*! \brief Verify an artifact held in memory; `where` names it in error messages. */
  static Artifact FromBytes(const std::vector<uint8_t>& data, const std::string& where);
  /*!
   * \brief Check that the artifact is signed by `key`: Ed25519 over "edgec artifact manifest
   * v1\n" and the manifest's bytes as stored. Throws Error(kInputFile) for an unusable key and
   * Error(kArtifact) for an unsigned, foreign-signed, modified or malformed artifact, with the
   * messages of edgec/signing.py's verify_artifact.
   */
  void VerifySignature(const TrustedKey& key) const;

  const std::string& where() const { return where_; }
  int format_version() const { return format_version_; }
  const std::string& manifest_json() const { return manifest_json_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  const std::vector<LibraryInfo>& libraries() const { return libraries_; }
  /*! \brief The bytes of `target`'s library; throws Error(kArtifact) for an unknown target. */
  const std::vector<uint8_t>& library(const std::string& target) const;
  /*!
   * \brief The library to run: `target` when given (it must exist), else the first CPU library
   * whose arch is this host's. Same rule and messages as the Python runtime's select_target.
   */
  std::string SelectTarget(const std::string& target = "") const;

 private:
  std::string where_;
  int format_version_ = 0;
  std::string manifest_json_;
  std::vector<TensorSpec> inputs_, outputs_;
  std::vector<LibraryInfo> libraries_;
  std::vector<ZipMember> files_;  // every member but the manifest and its signature
  bool is_signed_ = false;
  std::string signature_;  // manifest.sig's bytes, when signed
};

/*! \brief A named input: its data is copied into an aligned tensor, so any pointer will do. */
struct Input {
  std::string name;
  DLDataType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

/*!
 * \brief A loaded artifact, ready to run on this machine. Copies share one VM; calls into one VM
 * must not overlap (load the artifact once per thread to run in parallel).
 */
class Model {
 public:
  /*!
   * \brief Verify and load an artifact; pick the library for this host unless `target` names one.
   * \param threads the VM's thread pool size, when TVM_NUM_THREADS is not set (as in the Python
   *        runtime); 0: every core available to the process. TVM reads it once per process.
   */
  static Model Load(const std::string& path, const std::string& target = "", int threads = 0);
  static Model Load(const Artifact& artifact, const std::string& target = "", int threads = 0);
  /*! \brief As above; with options.require_signature set, the signature is verified first. */
  static Model Load(const std::string& path, const LoadOptions& options);

  const std::string& target() const { return target_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }

  /*!
   * \brief Run on named inputs (checked like the Python runtime: names, dtypes, ranks, fixed dims,
   * symbols shared between inputs); return the outputs in manifest order.
   */
  std::vector<tvm::ffi::Tensor> Run(const std::vector<Input>& inputs) const;
  /*!
   * \brief Run on tensors in `main`'s input order, without copies; each must be a contiguous CPU
   * tensor aligned to kAlignment (tensors from Empty() are). Checked like Run.
   */
  std::vector<tvm::ffi::Tensor> Run(const std::vector<tvm::ffi::Tensor>& args) const;
  /*! \brief Call the VM's `main` unchecked; the result is a tensor or a (nested) array of them. */
  tvm::ffi::Any RawCall(const std::vector<tvm::ffi::Tensor>& args) const;
  /*! \brief A raw result as a flat list of tensors, depth first. */
  static std::vector<tvm::ffi::Tensor> Flatten(const tvm::ffi::Any& result);

 private:
  // Call `main` and check it returned as many outputs as the manifest lists.
  std::vector<tvm::ffi::Tensor> CallChecked(const std::vector<tvm::ffi::Tensor>& args) const;
  std::string where_;
  std::string target_;
  std::vector<TensorSpec> inputs_, outputs_;
  tvm::ffi::Module library_{tvm::ffi::UnsafeInit()};
  tvm::ffi::Module vm_{tvm::ffi::UnsafeInit()};
  tvm::ffi::Function main_;
};

}  // namespace edgec

#endif  // EDGEC_RUNTIME_EDGEC_H_
