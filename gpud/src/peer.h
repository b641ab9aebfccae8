// Who is at the other end of a client connection: its credentials (SO_PEERCRED), a pidfd that
// names that very process, and whether it still lives. The daemon trusts and watches the process
// that connected, never a pid a client states.
#pragma once

#include <sys/types.h>

namespace gpud {

// The connecting process's pid and uid, or -1 when the socket cannot tell.
pid_t peer_pid_uid(int fd, uid_t* uid);

// The pidfd of the process that connected `fd`, taken at accept: from the socket itself
// (SO_PEERPIDFD names the very process SO_PEERCRED does, however long ago it connected); on a
// kernel without it (ENOPROTOOPT, before 6.5), opened from its pid (a pid reused between connect
// and accept is the window left there). It used to be opened from the pid at the hello, a window
// as long as the client liked. -1 with *gone set: the socket says its process has exited and been
// reaped (EINVAL/ESRCH before 6.16); opening its pid then could name another process. -1 without
// it: no pidfd could be had (out of descriptors): liveness from the socket and the pid.
int peer_pidfd(int fd, pid_t pid, bool* gone);

// Through its pidfd when there is one (a pid may be reused), else by its pid.
bool process_alive(int pidfd, pid_t pid);

}  // namespace gpud
