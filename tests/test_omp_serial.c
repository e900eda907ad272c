/* tests/test_omp_serial.c - kernels/cpu/omp_serial.c: a parallel region asked for one thread
 * (num_threads(1), or an if clause that is false) runs on the calling thread without a libgomp
 * team, and every construct the kernels use inside one still works; regions of two threads
 * still get two threads.
 * The override's own effect is visible as omp_get_level() = 0 inside a one-thread region (a
 * libgomp team of one reads 1); checked where GCC's libgomp is the runtime. */
#include <omp.h>
#include <pthread.h>

#include "check.h"

enum { N = 1000 };

/* Runs the kernels' constructs inside a region of nt threads (if clause nt > 1, as the ops write
 * it) and checks them: every iteration of a dynamic and a static loop once, a critical sum. */
static void region(int nt)
{
    static int hits_dyn[N], hits_static[N];
    memset(hits_dyn, 0, sizeof hits_dyn);
    memset(hits_static, 0, sizeof hits_static);
    int level = -1, team = -1, same_thread = 0, bad_tid = 0;
    long sum = 0;
    const pthread_t caller = pthread_self();
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        #pragma omp for schedule(dynamic, 1) nowait
        for (int i = 0; i < N; i++) __atomic_fetch_add(&hits_dyn[i], 1, __ATOMIC_RELAXED);
        #pragma omp for schedule(static)
        for (int i = 0; i < N; i++) __atomic_fetch_add(&hits_static[i], 1, __ATOMIC_RELAXED);
        #pragma omp critical
        {
            sum += omp_get_thread_num() + 1;
            if (omp_get_thread_num() == 0) {
                level = omp_get_level();
                team = omp_get_num_threads();
                same_thread = pthread_equal(pthread_self(), caller);
            }
            if (omp_get_thread_num() >= nt) bad_tid = 1;
        }
    }
    int once = 1;
    for (int i = 0; i < N; i++) once &= hits_dyn[i] == 1 && hits_static[i] == 1;
    check(once, "%d thread(s): every iteration of a dynamic and a static loop ran once", nt);
    check(team == nt && !bad_tid && sum == (long)nt * (nt + 1) / 2,
          "%d thread(s): a team of %d, thread numbers below it, critical sum %ld", nt, team, sum);
    check(same_thread, "%d thread(s): thread 0 is the calling thread", nt);
#if defined(__GNUC__) && !defined(__clang__)
    check(level == (nt > 1 ? 1 : 0), "%d thread(s): omp_get_level() inside is %d (%s)", nt, level,
          nt > 1 ? "a libgomp team" : "no team: kernels/cpu/omp_serial.c ran the body directly");
#else
    printf("SKIP omp_get_level check: not GCC's libgomp (level %d)\n", level);
#endif
}

int main(void)
{
    region(1);
    region(2);
    region(1); /* after a real team, a one-thread region is still served directly */
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
