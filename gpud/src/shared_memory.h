// A page of shared memory on a memfd: made and mapped by the daemon, handed to clients as a
// descriptor (read-write to its one writer, read-only to everyone else).
#pragma once

#include <cstddef>

namespace gpud {

class SharedPage {
 public:
  SharedPage() = default;
  // Creates a sealed-size memfd of one page, mapped read-write here. Throws DaemonError.
  explicit SharedPage(const char* name);
  ~SharedPage();
  SharedPage(SharedPage&& other) noexcept;
  SharedPage& operator=(SharedPage&& other) noexcept;
  SharedPage(const SharedPage&) = delete;
  SharedPage& operator=(const SharedPage&) = delete;

  void* data() const { return data_; }
  int fd() const { return fd_; }
  // A new read-only descriptor of the same memory (a mapping of it cannot be made writable).
  int open_read_only() const;
  static constexpr size_t kBytes = 4096;

 private:
  int fd_ = -1;
  void* data_ = nullptr;
};

// Maps a page a daemon handed over; throws ProtocolError if it is not one of ours.
void* map_received_page(int fd, bool writable);
void unmap_page(void* page);

}  // namespace gpud
