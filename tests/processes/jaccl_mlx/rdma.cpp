// The out-of-line members that MLX 0.32.4's `jaccl/rdma.h` declares and its wheel does not
// ship the code of: the `IBVWrapper` loader (pointed at the library `NUVEC_JACCL_VERBS`
// names, the test's software RDMA provider), `SharedBuffer`'s page-aligned memory and its
// registration, `Connection`'s bring-up (UC queue pair, INIT, RTR, RTS, the advertised
// `Destination`) and `create_connections`. Written for this test from the reference's byte
// description of JACCL's bring-up. Posting, polling and completion handling are the header's
// inline code, MLX's own.

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "jaccl/rdma.h"

namespace jaccl {

namespace {

constexpr int ACCESS =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
constexpr int PSN = 7;

[[noreturn]] void fail(const std::string& what, int code) {
  throw std::runtime_error(
      std::string(IBV_TAG) + " " + what + " failed: " + std::strerror(code));
}

template <typename F>
void load(void* handle, const char* name, F& slot, bool& ok) {
  slot = reinterpret_cast<F>(dlsym(handle, name));
  ok = ok && slot != nullptr;
}

} // namespace

IBVWrapper::IBVWrapper() {
  const char* path = std::getenv("NUVEC_JACCL_VERBS");
  librdma_handle_ =
      dlopen(path ? path : "librdma.dylib", RTLD_NOW | RTLD_GLOBAL);
  if (librdma_handle_ == nullptr) {
    return;
  }
  bool ok = true;
  load(librdma_handle_, "ibv_get_device_list", get_device_list, ok);
  load(librdma_handle_, "ibv_get_device_name", get_device_name, ok);
  load(librdma_handle_, "ibv_open_device", open_device, ok);
  load(librdma_handle_, "ibv_free_device_list", free_device_list, ok);
  load(librdma_handle_, "ibv_close_device", close_device, ok);
  load(librdma_handle_, "ibv_alloc_pd", alloc_pd, ok);
  load(librdma_handle_, "ibv_create_qp", create_qp, ok);
  load(librdma_handle_, "ibv_create_cq", create_cq, ok);
  load(librdma_handle_, "ibv_destroy_cq", destroy_cq, ok);
  load(librdma_handle_, "ibv_destroy_qp", destroy_qp, ok);
  load(librdma_handle_, "ibv_dealloc_pd", dealloc_pd, ok);
  load(librdma_handle_, "ibv_query_port", query_port, ok);
  load(librdma_handle_, "ibv_query_gid", query_gid, ok);
  load(librdma_handle_, "ibv_modify_qp", modify_qp, ok);
  load(librdma_handle_, "ibv_reg_mr", reg_mr, ok);
  load(librdma_handle_, "ibv_dereg_mr", dereg_mr, ok);
  if (!ok) {
    dlclose(librdma_handle_);
    librdma_handle_ = nullptr;
  }
}

IBVWrapper& ibv() {
  static IBVWrapper wrapper;
  return wrapper;
}

SharedBuffer::SharedBuffer(size_t num_bytes) : data_(nullptr), num_bytes_(num_bytes) {
  if (int e = posix_memalign(&data_, sysconf(_SC_PAGESIZE), num_bytes_); e != 0) {
    fail("posix_memalign", e);
  }
  std::memset(data_, 0, num_bytes_);
}

SharedBuffer::SharedBuffer(SharedBuffer&& b)
    : data_(b.data_),
      num_bytes_(b.num_bytes_),
      memory_regions_(std::move(b.memory_regions_)) {
  b.data_ = nullptr;
  b.num_bytes_ = 0;
  b.memory_regions_.clear();
}

SharedBuffer::~SharedBuffer() {
  for (auto& [pd, mr] : memory_regions_) {
    ibv().dereg_mr(mr);
  }
  std::free(data_);
}

void SharedBuffer::register_to_protection_domain(ibv_pd* protection_domain) {
  ibv_mr* mr = ibv().reg_mr(protection_domain, data_, num_bytes_, ACCESS);
  if (mr == nullptr) {
    fail("ibv_reg_mr", errno);
  }
  memory_regions_[protection_domain] = mr;
}

Connection::Connection(ibv_context* ctx_)
    : ctx(ctx_),
      protection_domain(nullptr),
      completion_queue(nullptr),
      queue_pair(nullptr) {
  std::memset(&src, 0, sizeof(src));
  src.local_id = -1;
}

Connection::Connection(Connection&& c)
    : ctx(c.ctx),
      protection_domain(c.protection_domain),
      completion_queue(c.completion_queue),
      queue_pair(c.queue_pair),
      src(c.src) {
  c.ctx = nullptr;
  c.protection_domain = nullptr;
  c.completion_queue = nullptr;
  c.queue_pair = nullptr;
}

Connection::~Connection() {
  if (queue_pair != nullptr) {
    ibv().destroy_qp(queue_pair);
  }
  if (completion_queue != nullptr) {
    ibv().destroy_cq(completion_queue);
  }
  if (protection_domain != nullptr) {
    ibv().dealloc_pd(protection_domain);
  }
  if (ctx != nullptr) {
    ibv().close_device(ctx);
  }
}

void Connection::allocate_protection_domain() {
  protection_domain = ibv().alloc_pd(ctx);
  if (protection_domain == nullptr) {
    fail("ibv_alloc_pd", errno);
  }
}

void Connection::create_completion_queue(int num_entries) {
  completion_queue = ibv().create_cq(ctx, num_entries, nullptr, nullptr, 0);
  if (completion_queue == nullptr) {
    fail("ibv_create_cq", errno);
  }
}

void Connection::create_queue_pair() {
  ibv_qp_init_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.send_cq = completion_queue;
  attr.recv_cq = completion_queue;
  attr.cap.max_send_wr = MAX_SEND_WR;
  attr.cap.max_recv_wr = MAX_RECV_WR;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = 0;
  attr.qp_type = IBV_QPT_UC;
  attr.sq_sig_all = 0;
  queue_pair = ibv().create_qp(protection_domain, &attr);
  if (queue_pair == nullptr) {
    fail("ibv_create_qp", errno);
  }
}

const Destination& Connection::info() {
  if (ctx == nullptr) {
    return src;
  }
  ibv_port_attr port;
  std::memset(&port, 0, sizeof(port));
  if (int e = ibv().query_port(ctx, 1, &port); e != 0) {
    fail("ibv_query_port", e);
  }
  src.local_id = port.lid;
  src.queue_pair_number = queue_pair->qp_num;
  src.packet_sequence_number = PSN;
  // The first IPv4-mapped GID (::ffff:a.b.c.d) of port 1.
  for (int i = 0; i < port.gid_tbl_len; i++) {
    ibv_gid gid;
    if (ibv().query_gid(ctx, 1, i, &gid) != 0) {
      continue;
    }
    bool mapped = gid.raw[10] == 0xff && gid.raw[11] == 0xff;
    for (int b = 0; b < 10; b++) {
      mapped = mapped && gid.raw[b] == 0;
    }
    if (mapped) {
      src.global_identifier = gid;
      return src;
    }
  }
  throw std::runtime_error("[jaccl] No IPv4-mapped GID on port 1");
}

void Connection::queue_pair_init() {
  ibv_qp_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = 1;
  attr.qp_access_flags = ACCESS;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  if (int e = ibv().modify_qp(queue_pair, &attr, mask); e != 0) {
    fail("INIT", e);
  }
}

void Connection::queue_pair_rtr(const Destination& dst) {
  ibv_qp_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_1024;
  attr.rq_psn = dst.packet_sequence_number;
  attr.dest_qp_num = dst.queue_pair_number;
  attr.ah_attr.dlid = dst.local_id;
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = 1;
  if (dst.global_identifier.global.interface_id != 0) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = dst.global_identifier;
    attr.ah_attr.grh.sgid_index = 1;
    attr.ah_attr.grh.hop_limit = 1;
  }
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
      IBV_QP_RQ_PSN;
  if (int e = ibv().modify_qp(queue_pair, &attr, mask); e != 0) {
    fail("RTR", e);
  }
}

void Connection::queue_pair_rts() {
  ibv_qp_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = src.packet_sequence_number;
  if (int e = ibv().modify_qp(queue_pair, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN);
      e != 0) {
    fail("RTS", e);
  }
}

std::vector<Connection> create_connections(
    const std::vector<std::string>& device_names) {
  if (!ibv().is_available()) {
    throw std::runtime_error("[jaccl] the verbs library is not available");
  }
  int count = 0;
  ibv_device** devices = ibv().get_device_list(&count);
  if (devices == nullptr) {
    fail("ibv_get_device_list", errno);
  }
  std::vector<Connection> connections;
  for (auto& name : device_names) {
    if (name.empty()) {
      connections.emplace_back(nullptr);
      continue;
    }
    ibv_context* ctx = nullptr;
    for (int i = 0; i < count; i++) {
      if (name == ibv().get_device_name(devices[i])) {
        ctx = ibv().open_device(devices[i]);
        break;
      }
    }
    if (ctx == nullptr) {
      ibv().free_device_list(devices);
      throw std::runtime_error("[jaccl] cannot open the device " + name);
    }
    connections.emplace_back(ctx);
  }
  ibv().free_device_list(devices);
  return connections;
}

} // namespace jaccl
