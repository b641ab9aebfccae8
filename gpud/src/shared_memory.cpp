#include "shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "gpud/gpud.h"

namespace gpud {

SharedPage::SharedPage(const char* name) {
  fd_ = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) throw DaemonError(fmt::format("memfd_create: {}", std::strerror(errno)));
  // Sealed at one page: a client holding the read-write descriptor cannot shrink it under the
  // daemon's mapping (SIGBUS) or grow it.
  if (ftruncate(fd_, kBytes) != 0 || fchmod(fd_, 0400) != 0 ||
      fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const int e = errno;
    close(fd_);
    throw DaemonError(fmt::format("sizing the shared page: {}", std::strerror(e)));
  }
  const std::string path = fmt::format("/proc/self/fd/{}", fd_);
  read_only_fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (read_only_fd_ < 0) {
    const int e = errno;
    close(fd_);
    throw DaemonError(fmt::format("reopening the shared page read-only: {}", std::strerror(e)));
  }
  data_ = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (data_ == MAP_FAILED) {
    const int e = errno;
    close(fd_);
    close(read_only_fd_);
    throw DaemonError(fmt::format("mapping the shared page: {}", std::strerror(e)));
  }
}

void SharedPage::seal_writes_by_others() {
  if (fcntl(fd_, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    throw DaemonError(fmt::format("sealing the shared page: {}", std::strerror(errno)));
  }
}

void SharedPage::forbid_more_seals() {
  if (fcntl(fd_, F_ADD_SEALS, F_SEAL_SEAL) != 0) {
    throw DaemonError(fmt::format("sealing the shared page's seals: {}", std::strerror(errno)));
  }
}

SharedPage::~SharedPage() {
  if (data_ != nullptr) munmap(data_, kBytes);
  if (fd_ >= 0) close(fd_);
  if (read_only_fd_ >= 0) close(read_only_fd_);
}

SharedPage::SharedPage(SharedPage&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      read_only_fd_(std::exchange(other.read_only_fd_, -1)),
      data_(std::exchange(other.data_, nullptr)) {}

SharedPage& SharedPage::operator=(SharedPage&& other) noexcept {
  if (this != &other) {
    this->~SharedPage();
    fd_ = std::exchange(other.fd_, -1);
    read_only_fd_ = std::exchange(other.read_only_fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

int SharedPage::open_read_only() const {
  const int ro = fcntl(read_only_fd_, F_DUPFD_CLOEXEC, 0);
  if (ro < 0) throw DaemonError(fmt::format("duplicating the shared page's read-only descriptor: {}", std::strerror(errno)));
  return ro;
}

void* map_received_page(int fd, bool writable) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(SharedPage::kBytes)) {
    throw ProtocolError("the daemon handed over a descriptor that is not a shared page");
  }
  void* p = mmap(nullptr, SharedPage::kBytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw ProtocolError(fmt::format("mapping a shared page: {}", std::strerror(errno)));
  const auto* head = static_cast<const uint32_t*>(p);
  if (head[0] != kPageMagic || head[1] != kProtocolVersion) {
    munmap(p, SharedPage::kBytes);
    throw ProtocolError("a shared page of another protocol version");
  }
  // A forked child (a data loader, a helper) does not inherit the pipeline's writable mapping: the
  // daemon tracks the one process that may still write the page once it left (daemon.cpp).
  if (writable && madvise(p, SharedPage::kBytes, MADV_DONTFORK) != 0) {
    const int e = errno;
    munmap(p, SharedPage::kBytes);
    throw ProtocolError(fmt::format("madvise(MADV_DONTFORK) on the pipeline page: {}", std::strerror(e)));
  }
  return p;
}

void unmap_page(void* page) {
  if (page != nullptr) munmap(page, SharedPage::kBytes);
}

}  // namespace gpud
