/*
 * locktest: lock contention checks for the guest lock suite (tools/vm/guest/locks.sh).
 * Built static on the host by run-guest.sh (the guest image has no compiler) and shipped as
 * /harness/locktest. Each check forks two processes that contend for a lock on FILE and prints
 * one "locktest: CHECK ok ..." line with what it measured, or "locktest: CHECK FAIL ..." and
 * exits 1.
 *
 *   locktest posix FILE HOLD_MS     fcntl: the parent holds F_WRLCK; the child's F_SETLK gets
 *                                   EAGAIN, F_GETLK names the parent's pid, F_SETLKW waits until
 *                                   the parent closes its descriptor; /proc/locks shows whether
 *                                   the guest kernel kept the lock (local) or the device (remote)
 *   locktest flock FILE HOLD_MS     the same with flock(2): LOCK_NB fails, LOCK_EX waits
 *   locktest deadlock FILE          two processes, each holding a byte the other waits for:
 *                                   the second F_SETLKW is EDEADLK
 *   locktest signal FILE HOLD_MS    a SIGALRM (handler, no SA_RESTART) during F_SETLKW: prints
 *                                   whether fcntl returned EINTR or waited for the lock
 *   locktest kill FILE HOLD_MS      SIGKILL to a process waiting in F_SETLKW: prints whether it
 *                                   died at once or only once the holder let go
 *   locktest cross posix|flock HOLDFILE WAITFILE HOLD_MS [GRANT_MAX_MS]
 *                                   one file seen through two mounts (two virtio-fs devices on one
 *                                   NFS export, or a device and another NFS client of it, whose
 *                                   locks only the server can compare): a process takes a write
 *                                   lock through HOLDFILE (fcntl: bytes 100-199; flock: the whole
 *                                   file) and keeps it; through WAITFILE the same lock's F_SETLK
 *                                   (LOCK_NB) is EAGAIN, F_GETLK shows a write lock on the range,
 *                                   and bytes 300-399 beside it are granted (fcntl); a third
 *                                   process's F_SETLKW (LOCK_EX) through WAITFILE must still wait
 *                                   after HOLD_MS, when the holder is killed with SIGKILL, and be
 *                                   granted after the kill, within GRANT_MAX_MS (30000) of it
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

static int open_rw(const char *path) {
  int fd = open(path, O_RDWR | O_CREAT, 0644);
  if (fd < 0) {
    fprintf(stderr, "locktest: open %s: %s\n", path, strerror(errno));
    exit(1);
  }
  return fd;
}

static int lock_range(int fd, int cmd, short type, off_t start, off_t len) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = start;
  fl.l_len = len;
  return fcntl(fd, cmd, &fl);
}

/* Lines of /proc/locks that name FILE's inode (0: the guest kernel holds no lock on it). */
static int proc_locks_entries(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return -1;
  char want[64];
  snprintf(want, sizeof want, "%02x:%02x:%lu ", major(st.st_dev), minor(st.st_dev), (unsigned long)st.st_ino);
  FILE *f = fopen("/proc/locks", "r");
  if (!f) return -1;
  char line[256];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, want)) n++;
  }
  fclose(f);
  return n;
}

/* The child's report, through a pipe. */
struct report {
  int ok;
  int err;
  long waited_ms;
  long pid_seen;
  long at_ms; /* now_ms() when the call returned (CLOCK_MONOTONIC: comparable across processes) */
  char what[96];
};

static void send_report(int fd, struct report *r) {
  if (write(fd, r, sizeof *r) != (ssize_t)sizeof *r) _exit(3);
}

static int recv_report(int fd, struct report *r) { return read(fd, r, sizeof *r) == (ssize_t)sizeof *r ? 0 : -1; }

static int fail(const char *check, const char *why) {
  printf("locktest: %s FAIL %s\n", check, why);
  return 1;
}

/* Parent holds the lock for hold_ms, the child contends. flock_mode: flock(2), else fcntl. */
static int contend(const char *check, const char *path, long hold_ms, int flock_mode) {
  int fd = open_rw(path);
  if (flock_mode ? flock(fd, LOCK_EX | LOCK_NB) : lock_range(fd, F_SETLK, F_WRLCK, 0, 0)) {
    printf("locktest: %s FAIL parent lock: %s\n", check, strerror(errno));
    return 1;
  }
  int local = proc_locks_entries(path);
  int p[2], go[2];
  if (pipe(p) || pipe(go)) return fail(check, "pipe");
  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) return fail(check, "fork");
  if (child == 0) {
    close(fd); /* the parent's open file: its flock must go with the parent's close */
    struct report r;
    memset(&r, 0, sizeof r);
    int cfd = open_rw(path);
    int rc = flock_mode ? flock(cfd, LOCK_EX | LOCK_NB) : lock_range(cfd, F_SETLK, F_WRLCK, 0, 0);
    if (rc == 0 || (errno != EAGAIN && errno != EACCES && errno != EWOULDBLOCK)) {
      r.err = rc == 0 ? 0 : errno;
      snprintf(r.what, sizeof r.what, "non-blocking attempt: %s", rc == 0 ? "got the lock" : strerror(errno));
      send_report(p[1], &r);
      _exit(0);
    }
    if (!flock_mode) {
      struct flock fl;
      memset(&fl, 0, sizeof fl);
      fl.l_type = F_WRLCK;
      fl.l_whence = SEEK_SET;
      if (fcntl(cfd, F_GETLK, &fl) != 0 || fl.l_type != F_WRLCK) {
        r.err = errno;
        snprintf(r.what, sizeof r.what, "F_GETLK: type %d (%s)", fl.l_type, strerror(errno));
        send_report(p[1], &r);
        _exit(0);
      }
      r.pid_seen = fl.l_pid;
    }
    char c = 0;
    if (write(go[1], &c, 1) != 1) _exit(3);
    long t0 = now_ms();
    rc = flock_mode ? flock(cfd, LOCK_EX) : lock_range(cfd, F_SETLKW, F_WRLCK, 0, 0);
    r.waited_ms = now_ms() - t0;
    r.err = rc == 0 ? 0 : errno;
    r.ok = rc == 0;
    snprintf(r.what, sizeof r.what, "%s", rc == 0 ? "granted" : strerror(errno));
    send_report(p[1], &r);
    _exit(0);
  }
  close(p[1]);
  close(go[1]);
  char c;
  if (read(go[0], &c, 1) != 1) {
    /* The child reported early (a failure): its report says why. */
  }
  sleep_ms(hold_ms);
  long released = now_ms();
  close(fd); /* FLUSH (and for flock RELEASE) drops the lock */
  struct report r;
  int got = recv_report(p[0], &r);
  int status = 0;
  waitpid(child, &status, 0);
  long after = now_ms() - released;
  if (got != 0) return fail(check, "no report from the child");
  if (!r.ok) {
    printf("locktest: %s FAIL child: %s\n", check, r.what);
    return 1;
  }
  if (r.waited_ms < hold_ms * 8 / 10) {
    printf("locktest: %s FAIL child got the lock after %ld ms, the parent held it %ld ms\n", check, r.waited_ms,
           hold_ms);
    return 1;
  }
  if (!flock_mode && r.pid_seen != parent) {
    printf("locktest: %s FAIL F_GETLK reported pid %ld, holder is %ld\n", check, r.pid_seen, (long)parent);
    return 1;
  }
  printf("locktest: %s ok child waited %ld ms (holder kept it %ld ms, granted %ld ms after the release)", check,
         r.waited_ms, hold_ms, after);
  if (!flock_mode) printf(" getlk_pid=%ld holder=%ld", r.pid_seen, (long)parent);
  printf(" proc_locks=%s\n", local == 0 ? "remote" : "local");
  return 0;
}

static int deadlock(const char *path) {
  const char *check = "deadlock";
  int fd = open_rw(path);
  if (lock_range(fd, F_SETLK, F_WRLCK, 0, 1)) return fail(check, "parent lock of byte 0");
  int ready[2], p[2];
  if (pipe(ready) || pipe(p)) return fail(check, "pipe");
  pid_t child = fork();
  if (child < 0) return fail(check, "fork");
  if (child == 0) {
    close(fd);
    int cfd = open_rw(path);
    struct report r;
    memset(&r, 0, sizeof r);
    if (lock_range(cfd, F_SETLK, F_WRLCK, 1, 1)) _exit(2);
    char c = 0;
    if (write(ready[1], &c, 1) != 1) _exit(3);
    sleep_ms(500); /* let the parent block on byte 1 */
    int rc = lock_range(cfd, F_SETLKW, F_WRLCK, 0, 1);
    r.err = rc == 0 ? 0 : errno;
    r.ok = rc != 0 && errno == EDEADLK;
    snprintf(r.what, sizeof r.what, "%s", rc == 0 ? "granted" : strerror(errno));
    send_report(p[1], &r);
    _exit(0); /* drops byte 1: the parent gets it */
  }
  close(ready[1]);
  close(p[1]);
  char c;
  if (read(ready[0], &c, 1) != 1) return fail(check, "child did not lock byte 1");
  long t0 = now_ms();
  int rc = lock_range(fd, F_SETLKW, F_WRLCK, 1, 1);
  long waited = now_ms() - t0;
  struct report r;
  int got = recv_report(p[0], &r);
  waitpid(child, NULL, 0);
  if (got != 0) return fail(check, "no report from the child");
  if (!r.ok) {
    printf("locktest: deadlock FAIL the child's F_SETLKW closing the cycle: %s\n", r.what);
    return 1;
  }
  if (rc != 0) {
    printf("locktest: deadlock FAIL the parent's F_SETLKW: %s\n", strerror(errno));
    return 1;
  }
  printf("locktest: deadlock ok second F_SETLKW of the cycle: %s; the first was granted after %ld ms\n", r.what,
         waited);
  return 0;
}

static void on_alarm(int sig) { (void)sig; }

static int signal_check(const char *path, long hold_ms) {
  int fd = open_rw(path);
  if (lock_range(fd, F_SETLK, F_WRLCK, 0, 0)) return fail("signal", "parent lock");
  int p[2];
  if (pipe(p)) return fail("signal", "pipe");
  pid_t child = fork();
  if (child < 0) return fail("signal", "fork");
  if (child == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: a local lock wait would return EINTR */
    sigaction(SIGALRM, &sa, NULL);
    close(fd);
    int cfd = open_rw(path);
    struct report r;
    memset(&r, 0, sizeof r);
    alarm(1);
    long t0 = now_ms();
    int rc = lock_range(cfd, F_SETLKW, F_WRLCK, 0, 0);
    r.waited_ms = now_ms() - t0;
    r.err = rc == 0 ? 0 : errno;
    r.ok = rc == 0 || errno == EINTR;
    snprintf(r.what, sizeof r.what, "%s", rc == 0 ? "returned 0 (waited for the lock)" : strerror(errno));
    send_report(p[1], &r);
    _exit(0);
  }
  close(p[1]);
  sleep_ms(hold_ms);
  close(fd);
  struct report r;
  int got = recv_report(p[0], &r);
  waitpid(child, NULL, 0);
  if (got != 0) return fail("signal", "no report from the child");
  if (!r.ok) {
    printf("locktest: signal FAIL F_SETLKW with SIGALRM after 1 s: %s\n", r.what);
    return 1;
  }
  printf("locktest: signal ok SIGALRM 1 s into F_SETLKW (holder kept the lock %ld ms): %s after %ld ms\n", hold_ms,
         r.what, r.waited_ms);
  return 0;
}

static int kill_check(const char *path, long hold_ms) {
  int fd = open_rw(path);
  if (lock_range(fd, F_SETLK, F_WRLCK, 0, 0)) return fail("kill", "parent lock");
  pid_t child = fork();
  if (child < 0) return fail("kill", "fork");
  if (child == 0) {
    close(fd);
    int cfd = open_rw(path);
    lock_range(cfd, F_SETLKW, F_WRLCK, 0, 0);
    _exit(0);
  }
  long t0 = now_ms();
  sleep_ms(300);
  kill(child, SIGKILL);
  long died = -1;
  while (now_ms() - t0 < hold_ms) {
    if (waitpid(child, NULL, WNOHANG) == child) {
      died = now_ms() - t0;
      break;
    }
    sleep_ms(10);
  }
  if (now_ms() - t0 < hold_ms) sleep_ms(hold_ms - (now_ms() - t0)); /* hold it the full time */
  long released = now_ms() - t0;
  close(fd);
  if (died < 0) {
    waitpid(child, NULL, 0);
    died = now_ms() - t0;
  }
  printf("locktest: kill ok SIGKILL at 300 ms into F_SETLKW: the process was gone after %ld ms (%s the holder "
         "let go at %ld ms)\n",
         died, died < released ? "before" : "after", released);
  return 0;
}

/* The cross check's lock: bytes 100-199 (fcntl) or the whole file (flock); wait: F_SETLKW/LOCK_EX. */
static int cross_lock(int fd, int flock_mode, int wait) {
  if (flock_mode) return flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
  return lock_range(fd, wait ? F_SETLKW : F_SETLK, F_WRLCK, 100, 100);
}

static int cross(const char *kind, const char *hold_path, const char *wait_path, long hold_ms, long grant_max_ms) {
  char check[32];
  snprintf(check, sizeof check, "cross-%s", kind);
  int flock_mode = strcmp(kind, "flock") == 0;
  int ready[2], p[2], go[2];
  if (pipe(ready) || pipe(p) || pipe(go)) return fail(check, "pipe");
  pid_t holder = fork();
  if (holder < 0) return fail(check, "fork");
  if (holder == 0) {
    /* Holds the lock until it is killed: its death (the kernel closing its files) must let go. */
    close(ready[0]);
    close(p[0]); /* the waiter's pipes: their ends must close when the waiter's do */
    close(p[1]);
    close(go[0]);
    close(go[1]);
    int fd = open_rw(hold_path);
    char c = 'y';
    if (cross_lock(fd, flock_mode, 0) != 0) {
      printf("locktest: %s FAIL the holder's lock through %s: %s\n", check, hold_path, strerror(errno));
      c = 'n';
    }
    if (write(ready[1], &c, 1) != 1) _exit(3);
    for (;;) pause();
  }
  close(ready[1]);
  char c = 0;
  if (read(ready[0], &c, 1) != 1 || c != 'y') {
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    return fail(check, "the holder has no lock");
  }
  /* Through the other mount: the same lock is refused, F_GETLK shows it, a range beside it is free. */
  char seen[128] = "";
  int fd = open(wait_path, O_RDWR);
  int rc = fd < 0 ? -1 : cross_lock(fd, flock_mode, 0);
  int err = errno;
  if (fd < 0 || rc == 0 || (err != EAGAIN && err != EACCES && err != EWOULDBLOCK)) {
    printf("locktest: %s FAIL non-blocking attempt through %s while %s holds it: %s\n", check, wait_path, hold_path,
           rc == 0 ? "got the lock" : strerror(err));
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    return 1;
  }
  if (!flock_mode) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 100;
    fl.l_len = 100;
    const char *why = NULL;
    if (fcntl(fd, F_GETLK, &fl) != 0) why = strerror(errno);
    else if (fl.l_type != F_WRLCK) why = "no conflicting write lock";
    else if (lock_range(fd, F_SETLK, F_WRLCK, 300, 100) != 0) why = "bytes 300-399 beside the held range refused";
    if (why) {
      printf("locktest: %s FAIL through %s: F_GETLK / a range beside: %s (errno %s)\n", check, wait_path, why,
             strerror(errno));
      kill(holder, SIGKILL);
      waitpid(holder, NULL, 0);
      return 1;
    }
    lock_range(fd, F_SETLK, F_UNLCK, 300, 100);
    snprintf(seen, sizeof seen, " getlk=write:%ld+%ld:pid=%ld beside=granted", (long)fl.l_start, (long)fl.l_len,
             (long)fl.l_pid);
  }
  close(fd);
  /* A waiter through the other mount: blocked while the holder lives, granted once it is killed. */
  pid_t waiter = fork();
  if (waiter < 0) return fail(check, "fork");
  if (waiter == 0) {
    close(p[0]);
    close(go[0]);
    struct report r;
    memset(&r, 0, sizeof r);
    int wfd = open_rw(wait_path);
    char g = 0;
    if (write(go[1], &g, 1) != 1) _exit(3); /* the holder's time counts from here */
    long t0 = now_ms();
    int wrc = cross_lock(wfd, flock_mode, 1);
    r.at_ms = now_ms();
    r.waited_ms = r.at_ms - t0;
    r.err = wrc == 0 ? 0 : errno;
    r.ok = wrc == 0;
    snprintf(r.what, sizeof r.what, "%s", wrc == 0 ? "granted" : strerror(errno));
    send_report(p[1], &r);
    _exit(0); /* lets go of its lock */
  }
  close(p[1]);
  close(go[1]);
  if (read(go[0], &c, 1) != 1) {
    /* The waiter died before its F_SETLKW: its report (if any) is read below. */
  }
  long t0 = now_ms();
  sleep_ms(hold_ms);
  struct pollfd pf = {.fd = p[0], .events = POLLIN};
  if (poll(&pf, 1, 0) != 0) {
    struct report r;
    int got = recv_report(p[0], &r);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    waitpid(waiter, NULL, 0);
    printf("locktest: %s FAIL the waiter through %s returned (%s) after %ld ms while the holder through %s lived\n",
           check, wait_path, got == 0 ? r.what : "no report", got == 0 ? r.waited_ms : -1L, hold_path);
    return 1;
  }
  long killed = now_ms();
  kill(holder, SIGKILL);
  waitpid(holder, NULL, 0);
  int ready_now = poll(&pf, 1, (int)grant_max_ms);
  struct report r;
  if (ready_now <= 0 || recv_report(p[0], &r) != 0) {
    kill(waiter, SIGKILL);
    waitpid(waiter, NULL, 0);
    printf("locktest: %s FAIL the waiter through %s not granted within %ld ms of the holder's SIGKILL\n", check,
           wait_path, grant_max_ms);
    return 1;
  }
  waitpid(waiter, NULL, 0);
  if (!r.ok) {
    printf("locktest: %s FAIL the waiter's %s through %s: %s\n", check, flock_mode ? "LOCK_EX" : "F_SETLKW", wait_path,
           r.what);
    return 1;
  }
  if (r.at_ms < killed) {
    printf("locktest: %s FAIL the waiter was granted %ld ms before the holder was killed\n", check, killed - r.at_ms);
    return 1;
  }
  printf("locktest: %s ok holder %s, other %s: nonblocking=%s%s; waiter blocked %ld ms, granted_after_kill_ms=%ld "
         "(SIGKILL at %ld ms)\n",
         check, hold_path, wait_path, err == EAGAIN ? "EAGAIN" : strerror(err), seen, r.waited_ms, r.at_ms - killed,
         killed - t0);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc >= 4 && strcmp(argv[1], "posix") == 0) return contend("posix", argv[2], atol(argv[3]), 0);
  if (argc >= 4 && strcmp(argv[1], "flock") == 0) return contend("flock", argv[2], atol(argv[3]), 1);
  if (argc >= 3 && strcmp(argv[1], "deadlock") == 0) return deadlock(argv[2]);
  if (argc >= 4 && strcmp(argv[1], "signal") == 0) return signal_check(argv[2], atol(argv[3]));
  if (argc >= 4 && strcmp(argv[1], "kill") == 0) return kill_check(argv[2], atol(argv[3]));
  if (argc >= 6 && strcmp(argv[1], "cross") == 0 && (strcmp(argv[2], "posix") == 0 || strcmp(argv[2], "flock") == 0))
    return cross(argv[2], argv[3], argv[4], atol(argv[5]), argc >= 7 ? atol(argv[6]) : 30000);
  fprintf(stderr, "usage: locktest posix|flock|signal|kill FILE HOLD_MS | locktest deadlock FILE | "
                  "locktest cross posix|flock HOLDFILE WAITFILE HOLD_MS [GRANT_MAX_MS]\n");
  return 2;
}
