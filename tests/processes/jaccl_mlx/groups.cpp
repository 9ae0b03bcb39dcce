// The group glue that MLX 0.32.4's `jaccl/mesh.h` and `jaccl/ring.h` declare and its wheel
// does not ship the code of: `MeshGroup` and `RingGroup`'s bring-up (queue pairs, buffers
// and their registrations, the side-channel exchange, the barrier), the dtype dispatch, which
// algorithm of `mesh_impl.h` / `ring_impl.h` runs for which size, and the multi-wire mesh's
// cut of an operation across its wires (`split_wires`). Written for this test from the
// reference's description of 0.32.4 (the same reading as `src/jaccl/frames.rs`). Every byte
// of a collective is moved and reduced by MLX's `MeshImpl` and `RingImpl`.

#include <algorithm>
#include <stdexcept>

#include "jaccl/mesh.h"
#include "jaccl/reduction_ops.h"
#include "jaccl/ring.h"
#include "jaccl/types.h"

namespace jaccl {

namespace {

// The mesh all-reduce's switch to reduce-scatter + all-gather (more than 2 ranks).
constexpr size_t MESH_SMALL_BYTES = 32768;
// The ring all-reduce's switch to two directions over every wire.
constexpr size_t RING_SMALL_BYTES = 32768;
// The ring sum-scatter's switch to every wire.
constexpr size_t RING_SCATTER_SMALL_BYTES = 65536;

// The wires of a mesh: the least number of devices over all pairs.
int mesh_wires(int rank, const std::vector<std::vector<std::string>>& names) {
  size_t wires = SIZE_MAX;
  for (size_t p = 0; p < names.size(); p++) {
    if (static_cast<int>(p) != rank) {
      wires = std::min(wires, names[p].size());
    }
  }
  return static_cast<int>(wires);
}

// Wire w's device towards every rank ("" towards this one).
std::vector<std::string> wire_devices(
    int rank,
    const std::vector<std::vector<std::string>>& names,
    int w) {
  std::vector<std::string> out;
  for (size_t p = 0; p < names.size(); p++) {
    out.push_back(static_cast<int>(p) == rank ? std::string() : names[p][w]);
  }
  return out;
}

void open_queue_pairs(std::vector<Connection>& conns) {
  for (auto& c : conns) {
    if (c.ctx == nullptr) {
      continue;
    }
    c.allocate_protection_domain();
    c.create_completion_queue(MAX_SEND_WR + MAX_RECV_WR);
    c.create_queue_pair();
  }
}

// Every connection's destination, in order, for the side-channel exchange.
std::vector<Destination> destinations(std::vector<Connection>& conns) {
  std::vector<Destination> out;
  for (auto& c : conns) {
    out.push_back(c.info());
  }
  return out;
}

// Brings a connection's queue pair to RTS towards the peer's destination `to`.
void ready(Connection& c, const Destination& to) {
  c.queue_pair_rtr(to);
  c.queue_pair_rts();
}

// A group's barrier: an all-sum of one byte.
template <typename G>
void sum_one_byte(G& group) {
  uint8_t b = 0;
  group.all_sum(&b, &b, sizeof(b), Dtype::UInt8);
}

} // namespace

// Defines `Group::name`, one of the dtype-taking members the headers declare, as MLX's
// dtype dispatch to the group's member template `impl<T>` (`all_reduce` or
// `reduce_scatter`) with reduction `Op<T>`. The eight such members of the two groups differ
// only in these names (and the members are private, so only a member can call them).
#define DEFINE_DTYPE_MEMBER(Group, name, impl, Op)                     \
  void Group::name(const void* in, void* out, size_t n, int dtype) {   \
    dispatch_all_types(dtype, [&](auto tag) {                          \
      using T = JACCL_GET_TYPE(tag);                                   \
      impl<T>(in, out, n, Op<T>{});                                    \
    });                                                                \
  }

MeshGroup::MeshGroup(
    int rank,
    const std::vector<std::vector<std::string>>& device_names,
    SideChannel sc)
    : rank_(rank),
      size_(device_names.size()),
      n_wires_(mesh_wires(rank, device_names)),
      side_channel_(std::move(sc)),
      pool_(std::max(0, mesh_wires(rank, device_names) - 1)) {
  if (size_ > MESH_MAX_PEERS) {
    throw std::runtime_error("[jaccl] more mesh ranks than MESH_MAX_PEERS");
  }
  for (int w = 0; w < n_wires_; w++) {
    connections_.push_back(
        create_connections(wire_devices(rank_, device_names, w)));
  }
  initialize();
  side_channel_.barrier();
  for (int w = 0; w < n_wires_; w++) {
    meshes_.emplace_back(
        rank_, size_, connections_[w], buffers_[w], scatter_buffers_[w]);
  }
}

void MeshGroup::initialize() {
  for (auto& wire : connections_) {
    open_queue_pairs(wire);
  }
  allocate_buffers();
  for (auto& wire : connections_) {
    for (int p = 0; p < size_; p++) {
      if (p != rank_) {
        wire[p].queue_pair_init();
      }
    }
  }
  // One exchange of W·R destinations, wire-major.
  std::vector<Destination> info;
  for (auto& wire : connections_) {
    auto of_wire = destinations(wire);
    info.insert(info.end(), of_wire.begin(), of_wire.end());
  }
  auto all = side_channel_.all_gather(info);
  for (int w = 0; w < n_wires_; w++) {
    for (int p = 0; p < size_; p++) {
      if (p != rank_) {
        ready(connections_[w][p], all[p][w * size_ + rank_]);
      }
    }
  }
}

void MeshGroup::allocate_buffers() {
  buffers_.clear();
  scatter_buffers_.clear();
  for (int w = 0; w < n_wires_; w++) {
    auto& conns = connections_[w];
    std::vector<SharedBuffer> buffers;
    std::vector<SharedBuffer> scatter;
    for (int k = 0; k < BUFFER_SIZES; k++) {
      for (int i = 0; i < NUM_BUFFERS; i++) {
        for (int j = 0; j < size_; j++) {
          buffers.emplace_back(FRAME_SIZE * (1 << k));
        }
        for (int j = 0; j < 2 * size_; j++) {
          scatter.emplace_back(FRAME_SIZE * (1 << k));
        }
      }
    }
    for (int k = 0; k < BUFFER_SIZES; k++) {
      for (int i = 0; i < NUM_BUFFERS; i++) {
        int base = k * NUM_BUFFERS * size_ + i * size_;
        for (int j = 0; j < size_; j++) {
          if (j == rank_) {
            // The send buffer goes to every peer.
            for (auto& c : conns) {
              if (c.ctx != nullptr) {
                buffers[base + j].register_to_protection_domain(
                    c.protection_domain);
              }
            }
          } else {
            buffers[base + j].register_to_protection_domain(
                conns[j].protection_domain);
          }
        }
        int sbase = k * NUM_BUFFERS * 2 * size_ + i * 2 * size_;
        for (int p = 0; p < size_; p++) {
          if (p == rank_) {
            continue;
          }
          scatter[sbase + p].register_to_protection_domain(
              conns[p].protection_domain);
          scatter[sbase + size_ + p].register_to_protection_domain(
              conns[p].protection_domain);
        }
      }
    }
    buffers_.push_back(std::move(buffers));
    scatter_buffers_.push_back(std::move(scatter));
  }
}

template <typename Fn>
void MeshGroup::split_wires(size_t n_bytes, int64_t total, Fn&& fn) {
  if (n_bytes < MESH_MULTI_WIRE_MIN_BYTES || n_wires_ <= 1) {
    fn(0, int64_t(0), total);
    return;
  }
  int64_t per_wire = (total + n_wires_ - 1) / n_wires_;
  dispatch_wires(&pool_, n_wires_, [&](int w) {
    int64_t start = std::min<int64_t>(w * per_wire, total);
    int64_t end = std::min<int64_t>(start + per_wire, total);
    fn(w, start, end - start);
  });
}

template <typename T, typename ReduceOp>
void MeshGroup::all_reduce(
    const void* input,
    void* output,
    size_t n_bytes,
    ReduceOp reduce_op) {
  auto in = static_cast<const T*>(input);
  auto out = static_cast<T*>(output);
  split_wires(n_bytes, n_bytes / sizeof(T), [&](int w, int64_t at, int64_t len) {
    if (size_ > 2 && len * sizeof(T) > MESH_SMALL_BYTES) {
      meshes_[w].all_reduce_scatter_gather(in + at, out + at, len, reduce_op);
    } else {
      meshes_[w].all_reduce(in + at, out + at, len, reduce_op);
    }
  });
}

DEFINE_DTYPE_MEMBER(MeshGroup, all_sum, all_reduce, SumOp)
DEFINE_DTYPE_MEMBER(MeshGroup, all_max, all_reduce, MaxOp)
DEFINE_DTYPE_MEMBER(MeshGroup, all_min, all_reduce, MinOp)

void MeshGroup::all_gather(const void* input, void* output, size_t n_bytes) {
  auto in = static_cast<const char*>(input);
  auto out = static_cast<char*>(output);
  split_wires(n_bytes, n_bytes, [&](int w, int64_t at, int64_t len) {
    meshes_[w].all_gather(in + at, out + at, len, n_bytes);
  });
}

template <typename T, typename ReduceOp>
void MeshGroup::reduce_scatter(
    const void* input,
    void* output,
    size_t n_bytes,
    ReduceOp reduce_op) {
  auto in = static_cast<const T*>(input);
  auto out = static_cast<T*>(output);
  int64_t count = n_bytes / sizeof(T);
  split_wires(n_bytes, count, [&](int w, int64_t at, int64_t len) {
    meshes_[w].sum_scatter(in + at, out + at, len, count, reduce_op);
  });
}

DEFINE_DTYPE_MEMBER(MeshGroup, sum_scatter, reduce_scatter, SumOp)

void MeshGroup::send(const void* input, size_t n_bytes, int dst) {
  auto in = static_cast<const char*>(input);
  split_wires(n_bytes, n_bytes, [&](int w, int64_t at, int64_t len) {
    meshes_[w].send(in + at, len, dst);
  });
}

void MeshGroup::recv(void* output, size_t n_bytes, int src) {
  auto out = static_cast<char*>(output);
  split_wires(n_bytes, n_bytes, [&](int w, int64_t at, int64_t len) {
    meshes_[w].recv(out + at, len, src);
  });
}

void MeshGroup::barrier() {
  sum_one_byte(*this);
}

RingGroup::RingGroup(
    int rank,
    int size,
    const std::vector<std::string>& left_devices,
    const std::vector<std::string>& right_devices,
    SideChannel sc)
    : rank_(rank),
      size_(size),
      n_conns_(left_devices.size()),
      side_channel_(std::move(sc)),
      left_(create_connections(left_devices)),
      right_(create_connections(right_devices)),
      pool_(std::max<int>(0, left_devices.size() - 1)) {
  if (left_devices.size() != right_devices.size() ||
      n_conns_ > RING_MAX_CONNS) {
    throw std::runtime_error("[jaccl] bad ring connections");
  }
  initialize();
  side_channel_.barrier();
  ring_ = RingImpl(
      rank_, size_, left_, right_, send_buffers_, recv_buffers_, &pool_);
}

void RingGroup::initialize() {
  open_queue_pairs(left_);
  open_queue_pairs(right_);
  allocate_buffers();
  for (auto* side : {&left_, &right_}) {
    for (auto& c : *side) {
      c.queue_pair_init();
    }
  }
  auto left_info = destinations(left_);
  auto right_info = destinations(right_);
  auto all_left = side_channel_.all_gather(left_info);
  auto all_right = side_channel_.all_gather(right_info);
  int left = (rank_ + size_ - 1) % size_;
  int right = (rank_ + 1) % size_;
  for (int w = 0; w < n_conns_; w++) {
    ready(left_[w], all_right[left][w]);
    ready(right_[w], all_left[right][w]);
  }
}

void RingGroup::allocate_buffers() {
  send_buffers_.clear();
  recv_buffers_.clear();
  for (int k = 0; k < BUFFER_SIZES; k++) {
    for (int i = 0; i < NUM_BUFFERS; i++) {
      for (int j = 0; j < 2 * n_conns_; j++) {
        send_buffers_.emplace_back(FRAME_SIZE * (1 << k));
        recv_buffers_.emplace_back(FRAME_SIZE * (1 << k));
      }
    }
  }
  // Slot lr·C + w: direction 0 sends right and receives from the left, 1 the other way.
  for (int k = 0; k < BUFFER_SIZES; k++) {
    for (int i = 0; i < NUM_BUFFERS; i++) {
      for (int j = 0; j < 2 * n_conns_; j++) {
        int w = j % n_conns_;
        int lr = j / n_conns_;
        int at = k * NUM_BUFFERS * n_conns_ * 2 + i * n_conns_ * 2 + j;
        auto& send_on = lr ? left_[w] : right_[w];
        auto& recv_on = lr ? right_[w] : left_[w];
        send_buffers_[at].register_to_protection_domain(
            send_on.protection_domain);
        recv_buffers_[at].register_to_protection_domain(
            recv_on.protection_domain);
      }
    }
  }
}

template <typename T, typename ReduceOp>
void RingGroup::all_reduce(
    const void* input,
    void* output,
    size_t n_bytes,
    ReduceOp reduce_op) {
  auto in = static_cast<const T*>(input);
  auto out = static_cast<T*>(output);
  int64_t count = n_bytes / sizeof(T);
  if (n_bytes <= RING_SMALL_BYTES || count < 2 * size_ * n_conns_) {
    ring_.all_reduce<1>(in, out, count, 1, reduce_op);
  } else {
    ring_.all_reduce<2>(in, out, count, n_conns_, reduce_op);
  }
}

DEFINE_DTYPE_MEMBER(RingGroup, all_sum, all_reduce, SumOp)
DEFINE_DTYPE_MEMBER(RingGroup, all_max, all_reduce, MaxOp)
DEFINE_DTYPE_MEMBER(RingGroup, all_min, all_reduce, MinOp)

void RingGroup::all_gather(const void* input, void* output, size_t n_bytes) {
  ring_.all_gather(
      static_cast<const char*>(input), static_cast<char*>(output), n_bytes,
      n_conns_);
}

template <typename T, typename ReduceOp>
void RingGroup::reduce_scatter(
    const void* input,
    void* output,
    size_t n_bytes,
    ReduceOp reduce_op) {
  auto in = static_cast<const T*>(input);
  auto out = static_cast<T*>(output);
  int64_t total = (n_bytes / sizeof(T)) * size_;
  int wires = (n_bytes <= RING_SCATTER_SMALL_BYTES ||
               total < 2 * size_ * n_conns_)
      ? 1
      : n_conns_;
  ring_.reduce_scatter(in, out, total, wires, reduce_op);
}

DEFINE_DTYPE_MEMBER(RingGroup, sum_scatter, reduce_scatter, SumOp)

void RingGroup::send(const void* input, size_t n_bytes, int dst) {
  ring_.send(static_cast<const char*>(input), n_bytes, dst, n_conns_);
}

void RingGroup::recv(void* output, size_t n_bytes, int src) {
  ring_.recv(static_cast<char*>(output), n_bytes, src, n_conns_);
}

void RingGroup::barrier() {
  sum_one_byte(*this);
}

#undef DEFINE_DTYPE_MEMBER

} // namespace jaccl
