// Peer credentials and liveness (peer.h).
#include "peer.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace gpud {

pid_t peer_pid_uid(int fd, uid_t* uid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
  *uid = cred.uid;
  return cred.pid;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5; glibc's headers may predate it
#endif

int peer_pidfd(int fd, pid_t pid, bool* gone) {
  *gone = false;
  int pidfd = -1;
  socklen_t len = sizeof pidfd;
  const int rc = getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len);
  if (rc == 0 && len == sizeof pidfd && pidfd >= 0) return pidfd;  // close-on-exec, as every pidfd
  if (rc != 0 && (errno == ESRCH || errno == EINVAL)) {
    *gone = true;  // the peer was reaped
    return -1;
  }
  // Any other failure (out of descriptors: EMFILE, ENFILE, ENOMEM) says nothing of the peer, which
  // was taken for gone and refused with a false reason: no pidfd, the socket's hang-up and the
  // pid tell instead.
  if (rc != 0 && errno != ENOPROTOOPT) return -1;
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;  // the socket's hang-up and the pid still tell
#endif
}

bool process_alive(int pidfd, pid_t pid) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    int rc;
    do {
      rc = poll(&p, 1, 0);
    } while (rc < 0 && errno == EINTR);
    return rc == 0;  // readable once the process exited
  }
  return kill(pid, 0) == 0 || errno == EPERM;
}

}  // namespace gpud
