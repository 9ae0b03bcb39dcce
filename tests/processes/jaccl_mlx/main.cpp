// A JACCL rank whose collectives are MLX 0.32.4's own code: the wheel's `mesh_impl.h`,
// `ring_impl.h`, `reduction_ops.h` and the data path inline in `rdma.h`, included unchanged.
// This file only reads the job (the environment `mlx.launch --backend jaccl` writes:
// MLX_RANK, MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR, MLX_JACCL_RING), chooses the topology
// as MLX's `Config` does, and runs the plan a test wrote (`NUVEC_JACCL_MLX_PLAN`, one
// operation a line, each rank's input in `in-<op>-<rank>.bin` beside it), writing each
// result to `out-<op>-<rank>.bin` in `NUVEC_JACCL_MLX_OUT` and printing `DIGEST <op> <fnv1a
// 64 of the result>`, as the Rust ranks of `tests/processes/jaccl_mlx.rs` do.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "jaccl/mesh.h"
#include "jaccl/ring.h"

namespace {

using Matrix = std::vector<std::vector<std::vector<std::string>>>;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    throw std::runtime_error(std::string("missing ") + name);
  }
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    throw std::runtime_error("cannot read " + path);
  }
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The device file: an array of rows of null, a string or an array of strings.
struct Parser {
  const std::string& text;
  size_t at = 0;

  void space() {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) {
      at++;
    }
  }
  bool take(char c) {
    space();
    if (at < text.size() && text[at] == c) {
      at++;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) {
      throw std::runtime_error("device file: expected " + std::string(1, c));
    }
  }
  std::string string() {
    expect('"');
    std::string s;
    while (at < text.size() && text[at] != '"') {
      s += text[at++];
    }
    expect('"');
    return s;
  }
  std::vector<std::string> entry() {
    space();
    if (text.compare(at, 4, "null") == 0) {
      at += 4;
      return {};
    }
    if (take('[')) {
      std::vector<std::string> names;
      if (!take(']')) {
        do {
          names.push_back(string());
        } while (take(','));
        expect(']');
      }
      return names;
    }
    return {string()};
  }
  Matrix matrix() {
    Matrix m;
    expect('[');
    do {
      expect('[');
      std::vector<std::vector<std::string>> row;
      do {
        row.push_back(entry());
      } while (take(','));
      expect(']');
      m.push_back(row);
    } while (take(','));
    expect(']');
    return m;
  }
};

bool valid_mesh(const Matrix& m) {
  for (size_t i = 0; i < m.size(); i++) {
    for (size_t j = 0; j < m.size(); j++) {
      if ((i == j) != m[i][j].empty()) {
        return false;
      }
    }
  }
  return m.size() >= 2;
}

bool valid_ring(const Matrix& m) {
  size_t n = m.size();
  if (n < 2) {
    return false;
  }
  size_t conns = m[0][1].size();
  for (size_t r = 0; r < n; r++) {
    if (m[r][(r + n - 1) % n].size() != conns || m[r][(r + 1) % n].size() != conns) {
      return false;
    }
  }
  return conns > 0;
}

uint64_t fnv1a(const std::vector<char>& data) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : data) {
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  return h;
}

int dtype_size(int dtype) {
  static const int sizes[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 8};
  return sizes[dtype];
}

// Whether `rank` sends before it receives when every rank sends to rank + shift: the even
// positions of its cycle, counted from the cycle's smallest rank.
bool sends_first(int rank, int size, int shift) {
  auto next = [&](int x) { return (x + shift) % size; };
  int start = rank;
  for (int x = next(rank); x != rank; x = next(x)) {
    start = std::min(start, x);
  }
  int position = 0;
  for (int at = start; at != rank; at = next(at)) {
    position++;
  }
  return position % 2 == 0;
}

void run(jaccl::Group& group, int rank, int size) {
  std::string plan_path = env("NUVEC_JACCL_MLX_PLAN");
  std::string dir = plan_path.substr(0, plan_path.rfind('/') + 1);
  std::string out_dir = env("NUVEC_JACCL_MLX_OUT") + "/";
  std::istringstream plan(read_file(plan_path));
  std::string line;
  for (int i = 0; std::getline(plan, line); i++) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    std::string in_text = read_file(
        dir + "in-" + std::to_string(i) + "-" + std::to_string(rank) + ".bin");
    std::vector<char> in(in_text.begin(), in_text.end());
    std::vector<char> out;
    if (kind == "sum" || kind == "max" || kind == "min") {
      int dtype;
      words >> dtype;
      out.resize(in.size());
      auto f = kind == "sum" ? &jaccl::Group::all_sum
          : kind == "max"    ? &jaccl::Group::all_max
                             : &jaccl::Group::all_min;
      (group.*f)(in.data(), out.data(), in.size(), dtype);
    } else if (kind == "gather") {
      out.resize(in.size() * size);
      group.all_gather(in.data(), out.data(), in.size());
    } else if (kind == "scatter") {
      int dtype;
      words >> dtype;
      out.resize(in.size() / size);
      group.sum_scatter(in.data(), out.data(), out.size(), dtype);
    } else if (kind == "sendrecv") {
      int shift;
      words >> shift;
      out.resize(in.size());
      int dst = (rank + shift) % size;
      int src = (rank + size - shift) % size;
      if (sends_first(rank, size, shift)) {
        group.send(in.data(), in.size(), dst);
        group.recv(out.data(), out.size(), src);
      } else {
        group.recv(out.data(), out.size(), src);
        group.send(in.data(), in.size(), dst);
      }
    } else {
      throw std::runtime_error("unknown operation " + line);
    }
    std::ofstream(
        out_dir + "out-" + std::to_string(i) + "-" + std::to_string(rank) + ".bin",
        std::ios::binary)
        .write(out.data(), out.size());
    std::printf("DIGEST %d %016llx\n", i, static_cast<unsigned long long>(fnv1a(out)));
    std::fflush(stdout);
  }
}

} // namespace

int main() {
  try {
    int rank = std::atoi(env("MLX_RANK").c_str());
    std::string text = read_file(env("MLX_IBV_DEVICES"));
    Matrix m = Parser{text}.matrix();
    int size = m.size();
    auto tcp = std::make_shared<jaccl::TCPAllGather>(
        rank, size, env("MLX_JACCL_COORDINATOR").c_str());
    auto side = [&]() {
      return jaccl::SideChannel(rank, size, [tcp](const char* s, char* d, size_t n) {
        (*tcp)(s, d, n);
      });
    };
    bool prefer_ring = std::getenv("MLX_JACCL_RING") != nullptr;
    std::unique_ptr<jaccl::Group> group;
    if ((prefer_ring || !valid_mesh(m)) && valid_ring(m)) {
      group = std::make_unique<jaccl::RingGroup>(
          rank, size, m[rank][(rank + size - 1) % size], m[rank][(rank + 1) % size],
          side());
      std::printf("TOPOLOGY ring\n");
    } else if (valid_mesh(m)) {
      group = std::make_unique<jaccl::MeshGroup>(rank, m[rank], side());
      std::printf("TOPOLOGY mesh\n");
    } else {
      throw std::runtime_error("neither a valid mesh nor a valid ring");
    }
    run(*group, rank, size);
    std::printf("PLAN DONE\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "jaccl rank from MLX's headers: %s\n", e.what());
    return 1;
  }
}
