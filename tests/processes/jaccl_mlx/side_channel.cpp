// The side channel that MLX 0.32.4's wheel declares in `jaccl/tcp.h` and `jaccl/rdma.h`
// (`TCPSocket`, `parse_address`, `TCPAllGather`, `SideChannel`) but does not ship the code
// of: written for this test from the byte description of JACCL's side channel (a TCP star
// through rank 0: a 4-byte rank hello, then every all-gather read from the ranks in rank
// order and sent back whole). It moves only the bring-up's records; every collective's bytes
// are moved by MLX's own headers.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "jaccl/rdma.h"
#include "jaccl/tcp.h"

namespace jaccl {

namespace {

[[noreturn]] void fail(const char* tag, const std::string& what) {
  throw std::runtime_error(
      std::string(tag) + " " + what + ": " + std::strerror(errno));
}

} // namespace

address_t parse_address(const std::string& ip, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(ip.c_str(), port.c_str(), &hints, &found); e != 0) {
    throw std::runtime_error(
        "[jaccl] cannot resolve " + ip + ":" + port + ": " + gai_strerror(e));
  }
  address_t address{};
  std::memcpy(&address.addr, found->ai_addr, found->ai_addrlen);
  address.len = found->ai_addrlen;
  freeaddrinfo(found);
  return address;
}

address_t parse_address(const std::string& ip_port) {
  auto colon = ip_port.rfind(':');
  if (colon == std::string::npos) {
    throw std::runtime_error("[jaccl] not an ip:port address: " + ip_port);
  }
  return parse_address(ip_port.substr(0, colon), ip_port.substr(colon + 1));
}

TCPSocket::TCPSocket(const char* tag) : sock_(socket(AF_INET, SOCK_STREAM, 0)) {
  if (sock_ < 0) {
    fail(tag, "socket");
  }
}

TCPSocket::TCPSocket(int sock) : sock_(sock) {}

TCPSocket::TCPSocket(TCPSocket&& s) : sock_(s.sock_) {
  s.sock_ = -1;
}

TCPSocket& TCPSocket::operator=(TCPSocket&& s) {
  if (this != &s) {
    if (sock_ >= 0) {
      close(sock_);
    }
    sock_ = s.sock_;
    s.sock_ = -1;
  }
  return *this;
}

TCPSocket::~TCPSocket() {
  if (sock_ >= 0) {
    close(sock_);
  }
}

void TCPSocket::listen(const char* tag, const address_t& addr) {
  int on = 1;
  setsockopt(sock_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  setsockopt(sock_, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on));
  if (bind(sock_, addr.get(), addr.len) != 0) {
    fail(tag, "bind");
  }
  // MLX listens with a backlog of 0. When ranks connect at once, Linux then completes
  // handshakes with SYN cookies and drops segments while the accept queue is full, and a
  // client segment that reaches the listener before its connection is accepted but does not
  // start at the first byte (MLX's block after its hello, sent by a tail-loss probe) fails the
  // cookie check: the connection is reset, and rank 0 waits in accept for a rank that gave
  // up. That is MLX's fragility, not what this test is about, so this glue listens with
  // room for every rank. The crate's ranks avoid it against MLX's own rank 0 (see
  // `src/jaccl/side_channel/mod.rs`; tested against a backlog of 0 in
  // `tests/config/jaccl_side_channel.rs`).
  if (::listen(sock_, 128) != 0) {
    fail(tag, "listen");
  }
}

TCPSocket TCPSocket::accept(const char* tag) {
  int s = ::accept(sock_, nullptr, nullptr);
  if (s < 0) {
    fail(tag, "accept");
  }
  return TCPSocket(s);
}

void TCPSocket::send(const char* tag, const void* data, size_t len) {
  auto p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(sock_, p, len, MSG_NOSIGNAL);
    if (n <= 0) {
      fail(tag, "send");
    }
    p += n;
    len -= n;
  }
}

void TCPSocket::recv(const char* tag, void* data, size_t len) {
  auto p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = ::recv(sock_, p, len, 0);
    if (n <= 0) {
      if (n == 0) {
        errno = ECONNRESET;
      }
      fail(tag, "recv");
    }
    p += n;
    len -= n;
  }
}

int TCPSocket::detach() {
  int s = sock_;
  sock_ = -1;
  return s;
}

TCPSocket TCPSocket::connect(
    const char* tag,
    const address_t& addr,
    int num_retries,
    int wait,
    std::function<void(int, int)> cb) {
  for (int attempt = 0;; attempt++) {
    TCPSocket s(tag);
    if (::connect(s.sock_, addr.get(), addr.len) == 0) {
      return s;
    }
    if (attempt + 1 >= num_retries) {
      fail(tag, "connect");
    }
    if (cb) {
      cb(attempt, wait);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(wait));
  }
}

TCPAllGather::TCPAllGather(int rank, int size, const char* addr)
    : rank_(rank), size_(size) {
  auto address = parse_address(addr);
  if (rank_ == 0) {
    TCPSocket listener(IBV_TAG);
    listener.listen(IBV_TAG, address);
    std::vector<TCPSocket> accepted;
    std::vector<int> ranks;
    for (int i = 1; i < size_; i++) {
      accepted.push_back(listener.accept(IBV_TAG));
      int r = -1;
      accepted.back().recv(IBV_TAG, &r, sizeof(r));
      if (r <= 0 || r >= size_) {
        throw std::runtime_error("[jaccl] a side-channel hello of a bad rank");
      }
      ranks.push_back(r);
    }
    // Slot k holds rank k + 1.
    for (int r = 1; r < size_; r++) {
      for (size_t i = 0; i < ranks.size(); i++) {
        if (ranks[i] == r) {
          sockets_.push_back(std::move(accepted[i]));
        }
      }
    }
  } else {
    // The coordinator may not listen yet: a bounded number of short waits.
    sockets_.push_back(TCPSocket::connect(IBV_TAG, address, 400, 50));
    sockets_.back().send(IBV_TAG, &rank_, sizeof(rank_));
  }
}

void TCPAllGather::operator()(const char* src, char* dst, size_t n_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank_ == 0) {
    std::memcpy(dst, src, n_bytes);
    for (int r = 1; r < size_; r++) {
      sockets_[r - 1].recv(IBV_TAG, dst + r * n_bytes, n_bytes);
    }
    for (int r = 1; r < size_; r++) {
      sockets_[r - 1].send(IBV_TAG, dst, size_ * n_bytes);
    }
  } else {
    sockets_[0].send(IBV_TAG, src, n_bytes);
    sockets_[0].recv(IBV_TAG, dst, size_ * n_bytes);
  }
}

SideChannel::SideChannel(int rank, int size, AllGatherFn agf)
    : rank_(rank), size_(size), all_gather_fn_(std::move(agf)) {}

SideChannel::SideChannel(SideChannel&& sc)
    : rank_(sc.rank_),
      size_(sc.size_),
      all_gather_fn_(std::move(sc.all_gather_fn_)) {}

} // namespace jaccl
