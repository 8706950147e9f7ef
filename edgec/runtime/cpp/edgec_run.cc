/*
 * edgec_run: run an `.edgec` artifact from the command line with the C++ runtime.
 *
 *   edgec_run MODEL.edgec [NAME=FILE.npy ...] [--inputs FILE.npz] [-o DIR] [--target T]
 *             [--threads N] [--repeat N] [--info] [--require-signature KEY]
 *
 * Inputs come from .npy files (one per input, NAME=FILE) or an .npz keyed by input name (what
 * `edgec zoo export` writes); outputs are written as DIR/<output name>.npy (characters other than
 * letters, digits, '.', '-' and '_' replaced by '_'). --repeat N runs N more times and prints the
 * mean and best time of a checked call and of a raw VM call. --require-signature KEY refuses an
 * artifact without a valid Ed25519 signature by the public key in file KEY, as `edgec run
 * --require-signature` does (with --info too, which loads nothing). Errors print one line,
 * `edgec_run: error: ...`, and exit with the code `edgec` uses for the same error.
 */
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "edgec.h"

namespace {

namespace ffi = tvm::ffi;
using edgec::Error;
using edgec::ErrorKind;

struct Array {
  std::string name;
  DLDataType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

const std::map<std::string, std::string>& NpyToNumpy() {
  static const std::map<std::string, std::string> table = {
      {"b1", "bool"},  {"f2", "float16"}, {"f4", "float32"}, {"f8", "float64"},
      {"i1", "int8"},  {"i2", "int16"},   {"i4", "int32"},   {"i8", "int64"},
      {"u1", "uint8"}, {"u2", "uint16"},  {"u4", "uint32"},  {"u8", "uint64"}};
  return table;
}

// The value of `key` in a .npy header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2,
// 3), }
std::string HeaderValue(const std::string& header, const std::string& key,
                        const std::string& where) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos)
    throw Error(ErrorKind::kSamples, where + ": .npy header lacks " + key);
  at = header.find(':', at);
  size_t begin = header.find_first_not_of(' ', at + 1);
  size_t end = header[begin] == '('    ? header.find(')', begin) + 1
               : header[begin] == '\'' ? header.find('\'', begin + 1) + 1
                                       : header.find_first_of(",}", begin);
  return header.substr(begin, end - begin);
}

Array ParseNpy(const std::vector<uint8_t>& bytes, const std::string& name,
               const std::string& where) {
  const Error bad(ErrorKind::kSamples, "cannot read " + where + ": not a .npy file");
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) throw bad;
  int major = bytes[6];
  size_t header_len, offset;
  if (major == 1) {
    header_len = bytes[8] | (bytes[9] << 8);
    offset = 10;
  } else if ((major == 2 || major == 3) && bytes.size() >= 12) {
    header_len = bytes[8] | (bytes[9] << 8) | (bytes[10] << 16) | (size_t(bytes[11]) << 24);
    offset = 12;
  } else {
    throw bad;
  }
  if (offset + header_len > bytes.size()) throw bad;
  std::string header(bytes.begin() + offset, bytes.begin() + offset + header_len);
  std::string descr = HeaderValue(header, "descr", where);  // '<f4'
  if (descr.size() != 5 || (descr[1] != '<' && descr[1] != '|')) {
    throw Error(ErrorKind::kSamples, where + ": dtype " + descr +
                                         " is not supported (little-endian "
                                         "numeric arrays only)");
  }
  auto kind = NpyToNumpy().find(descr.substr(2, 2));
  if (kind == NpyToNumpy().end()) {
    throw Error(ErrorKind::kSamples, where + ": dtype " + descr + " is not supported");
  }
  if (HeaderValue(header, "fortran_order", where) != "False") {
    throw Error(ErrorKind::kSamples, where + ": Fortran-ordered arrays are not supported");
  }
  Array array;
  array.name = name;
  array.dtype = edgec::ParseDType(kind->second);
  std::string shape = HeaderValue(header, "shape", where);
  size_t count = 1;
  for (size_t i = 1; i < shape.size();) {
    size_t end;
    if (!std::isdigit(static_cast<unsigned char>(shape[i]))) {
      ++i;
      continue;
    }
    int64_t dim = std::stoll(shape.substr(i), &end);
    array.shape.push_back(dim);
    count *= static_cast<size_t>(dim);
    i += end;
  }
  size_t nbytes = count * (array.dtype.bits / 8);
  size_t data_at = offset + header_len;
  if (data_at + nbytes > bytes.size()) throw Error(ErrorKind::kSamples, where + " is truncated");
  array.data.assign(bytes.begin() + data_at, bytes.begin() + data_at + nbytes);
  return array;
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(ErrorKind::kInputFile, "'" + path + "' does not exist");
  }
  std::ifstream file(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(file)),
                              std::istreambuf_iterator<char>());
}

std::vector<Array> ReadNpz(const std::string& path) {
  std::vector<Array> arrays;
  for (const edgec::ZipMember& member : edgec::ReadZip(ReadFile(path), path)) {
    std::string name = member.name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) {
      name.resize(name.size() - 4);
    }
    arrays.push_back(ParseNpy(member.data, name, "'" + path + "' member '" + member.name + "'"));
  }
  return arrays;
}

std::string NpyDescr(DLDataType dtype) {
  std::string name = edgec::DTypeName(dtype);
  for (const auto& kv : NpyToNumpy()) {
    if (kv.second == name)
      return std::string(kv.first == "b1" || kv.first[1] == '1' ? "|" : "<") + kv.first;
  }
  throw Error(ErrorKind::kSamples, "cannot write dtype " + name + " as .npy");
}

void WriteNpy(const std::string& path, const ffi::Tensor& tensor) {
  std::string shape = "(";
  for (int i = 0; i < tensor.ndim(); ++i) {
    shape += std::to_string(tensor.shape()[i]) +
             (tensor.ndim() == 1 || i + 1 < tensor.ndim() ? "," : "");
    if (i + 1 < tensor.ndim()) shape += " ";
  }
  shape += ")";
  std::string header = "{'descr': '" + NpyDescr(tensor.dtype()) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(tensor.data_ptr()),
            static_cast<std::streamsize>(ffi::GetDataSize(tensor)));
  if (!out) throw Error(ErrorKind::kInputFile, "cannot write '" + path + "'");
}

std::string SafeName(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  return out.empty() || out[0] == '.' ? "_" + out : out;
}

std::string ShapeText(const ffi::Tensor& t) {
  std::string out = "[";
  for (int i = 0; i < t.ndim(); ++i) out += (i ? ", " : "") + std::to_string(t.shape()[i]);
  return out + "]";
}

std::string DimsText(const edgec::TensorSpec& spec) {
  std::string out = "[";
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    const edgec::Dim& d = spec.dims[i];
    out += (i ? ", " : "") + (d.symbolic() ? d.symbol : std::to_string(d.value));
  }
  return out + "]";
}

const char* kUsage =
    "usage: edgec_run MODEL.edgec [NAME=FILE.npy ...] [--inputs FILE.npz] [-o DIR]\n"
    "                 [--target T] [--threads N] [--repeat N] [--info]\n"
    "                 [--require-signature KEY]\n";

int Main(int argc, char** argv) {
  std::string artifact_path, inputs_npz, out_dir;
  edgec::LoadOptions options;
  int repeat = 0;
  bool info = false;
  std::vector<std::pair<std::string, std::string>> npy_inputs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(ErrorKind::kSamples, arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--inputs") {
      inputs_npz = value();
    } else if (arg == "-o" || arg == "--output") {
      out_dir = value();
    } else if (arg == "--target") {
      options.target = value();
    } else if (arg == "--threads") {
      options.threads = std::stoi(value());
    } else if (arg == "--repeat") {
      repeat = std::stoi(value());
    } else if (arg == "--require-signature") {
      options.require_signature.file = value();
    } else if (arg == "--info") {
      info = true;
    } else if (arg.find('=') != std::string::npos && !arg.empty() && arg[0] != '-') {
      npy_inputs.emplace_back(arg.substr(0, arg.find('=')), arg.substr(arg.find('=') + 1));
    } else if (artifact_path.empty() && !arg.empty() && arg[0] != '-') {
      artifact_path = arg;
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  if (artifact_path.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  if (info) {
    edgec::Artifact artifact = edgec::Artifact::Open(artifact_path, options.require_signature);
    std::cout << "format " << artifact.format_version() << ", host " << edgec::HostArch() << "\n";
    for (const auto& lib : artifact.libraries()) {
      std::cout << "library " << lib.target << " (" << lib.arch << ", " << lib.device << ") "
                << lib.file << " sha256 " << lib.sha256 << "\n";
    }
    // As loading would: the library this CPU runs, or the reason none fits.
    std::cout << "runs " << artifact.SelectTarget(options.target) << "\n";
    for (const auto& spec : artifact.inputs()) {
      std::cout << "input " << spec.name << ": " << spec.dtype << " " << DimsText(spec) << "\n";
    }
    for (const auto& spec : artifact.outputs()) {
      std::cout << "output " << spec.name << ": " << spec.dtype << " " << DimsText(spec) << "\n";
    }
    return 0;
  }
  std::vector<Array> arrays;
  if (!inputs_npz.empty()) arrays = ReadNpz(inputs_npz);
  for (const auto& [name, path] : npy_inputs)
    arrays.push_back(ParseNpy(ReadFile(path), name, "'" + path + "'"));

  edgec::Model model = edgec::Model::Load(artifact_path, options);
  std::vector<edgec::Input> inputs;
  for (const Array& a : arrays) inputs.push_back({a.name, a.dtype, a.shape, a.data.data()});
  std::vector<ffi::Tensor> outputs = model.Run(inputs);

  if (repeat > 0) {
    using Clock = std::chrono::steady_clock;
    auto time_calls = [&](auto&& call) {
      double total = 0, best = 1e30;
      for (int r = 0; r < repeat; ++r) {
        auto start = Clock::now();
        call();
        double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        total += us;
        best = std::min(best, us);
      }
      return std::make_pair(total / repeat, best);
    };
    auto checked = time_calls([&] { model.Run(inputs); });
    std::vector<ffi::Tensor> args;
    for (const auto& spec : model.inputs()) {
      for (const Array& a : arrays) {
        if (a.name != spec.name) continue;
        ffi::Tensor t = edgec::Empty(a.shape, a.dtype);
        std::memcpy(t.data_ptr(), a.data.data(), a.data.size());
        args.push_back(t);
      }
    }
    auto raw = time_calls([&] { model.RawCall(args); });
    std::printf(
        "timing over %d calls: Run mean %.1f us best %.1f us; raw call mean %.1f us best %.1f us\n",
        repeat, checked.first, checked.second, raw.first, raw.second);
  }

  if (!out_dir.empty()) mkdir(out_dir.c_str(), 0755);
  std::map<std::string, std::string> written;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& name = model.outputs()[i].name;
    std::cout << name << ": " << edgec::DTypeName(outputs[i].dtype()) << " "
              << ShapeText(outputs[i]);
    if (!out_dir.empty()) {
      std::string file = SafeName(name) + ".npy";
      if (written.count(file)) {
        throw Error(ErrorKind::kInputFile, "outputs '" + written[file] + "' and '" + name +
                                               "' would both be written to " + file);
      }
      written[file] = name;
      WriteNpy(out_dir + "/" + file, outputs[i]);
      std::cout << " -> " << out_dir << "/" << file;
    }
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const Error& e) {
    std::cerr << "edgec_run: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    // Failures inside the model (the VM's shape checks) and anything unexpected: one line.
    std::string text = e.what();
    if (const auto* ffi_error = dynamic_cast<const tvm::ffi::Error*>(&e)) {
      text = ffi_error->kind() + ": " + ffi_error->message();
    }
    std::cerr << "edgec_run: error: " << text.substr(0, text.find('\n')) << "\n";
    return 1;
  }
}
