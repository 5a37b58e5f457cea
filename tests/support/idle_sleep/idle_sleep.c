/* sched_yield for the test suite's oversubscribed MPI ranks (LD_PRELOAD; built by tests/support/idle_sleep.py).
 *
 * A rank that waits in MPICH polls its progress engine and calls sched_yield every thousand polls
 * (MPIR_CVAR_POLLS_BEFORE_YIELD); Linux's scheduler barely honours that yield, so on the 2-core CI machine,
 * where a launch runs 4 or 8 ranks, a waiting rank keeps half a core from the rank it waits for (4 ranks, one
 * computing 2.5 s, three waiting: 5.4 s). MPICH has no setting that sleeps instead. Here a thread's yields
 * that come less than 200 us apart form one wait; once a wait has lasted 1 ms, each further yield sleeps
 * 100 us. Short waits (most of a small exchange) yield as before; a long one costs at most 100 us of latency
 * and almost no CPU (the same 4 ranks: 2.6 s). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <time.h>

#define NEW_WAIT_GAP_NS 200000LL
#define SLEEP_AFTER_NS 1000000LL
#define SLEEP_NS 100000L

static __thread long long last_yield_ns, wait_began_ns;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int sched_yield(void) {
    static int (*system_yield)(void);
    long long now = now_ns();
    if (now - last_yield_ns > NEW_WAIT_GAP_NS)
        wait_began_ns = now;
    last_yield_ns = now;
    if (now - wait_began_ns > SLEEP_AFTER_NS) {
        struct timespec pause = {0, SLEEP_NS};
        nanosleep(&pause, 0);
        last_yield_ns = now_ns();
        return 0;
    }
    if (!system_yield)
        system_yield = (int (*)(void))dlsym(RTLD_NEXT, "sched_yield");
    return system_yield ? system_yield() : 0;
}
