// A page of shared memory on a memfd: made and mapped by the daemon, handed to clients as a
// descriptor (read-write to its one writer, read-only to everyone else).
#pragma once

#include <cstddef>

namespace gpud {

class SharedPage {
 public:
  SharedPage() = default;
  // Creates a memfd of one page, sealed at that size and mode 0400 (a read-only descriptor cannot
  // be reopened read-write through /proc, except by root or by a process of the page's own uid,
  // which can fchmod it first: a client of the daemon's uid is not kept from writing the pipeline
  // page; see README.md, "orion-gpud"), mapped read-write here. Its read-only descriptor is opened
  // here, once: a client of the daemon's uid that fchmods the page later cannot keep the daemon
  // from handing it to the next client. Throws DaemonError.
  explicit SharedPage(const char* name);
  // No writes through any other descriptor or mapping from now on, root's included (this
  // process's mapping stays writable): for pages only the daemon writes (grants).
  void seal_writes_by_others();
  // For a page whose read-write descriptor goes to a client (the pipeline page, a usage page): no
  // seal can be added any more, so the client cannot add F_SEAL_FUTURE_WRITE and lock the next
  // pipeline (or client) out of a writable mapping.
  void forbid_more_seals();
  ~SharedPage();
  SharedPage(SharedPage&& other) noexcept;
  SharedPage& operator=(SharedPage&& other) noexcept;
  SharedPage(const SharedPage&) = delete;
  SharedPage& operator=(const SharedPage&) = delete;

  void* data() const { return data_; }
  int fd() const { return fd_; }
  // A new read-only descriptor of the same memory (a duplicate of the one opened at creation);
  // throws DaemonError.
  int open_read_only() const;
  static constexpr size_t kBytes = 4096;

 private:
  int fd_ = -1;
  int read_only_fd_ = -1;
  void* data_ = nullptr;
};

// Maps a page a daemon handed over; throws ProtocolError if it is not one of ours. A writable
// mapping is left out of fork()ed children (MADV_DONTFORK).
void* map_received_page(int fd, bool writable);
void unmap_page(void* page);

}  // namespace gpud
