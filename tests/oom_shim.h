/*
 * oom_shim.h -- allocation failure on demand (oom_shim.c).
 */
#ifndef KEEL_TEST_OOM_SHIM_H
#define KEEL_TEST_OOM_SHIM_H

#include <stdbool.h>

/* False in sanitizer builds, where the sanitizer owns malloc. */
bool oom_shim_active(void);
/* Fail the k-th allocation this thread makes from now on (k >= 1), once. */
void oom_arm(long k);
/* Fail the k-th allocation any thread makes from now on, once. */
void oom_arm_all(long k);
/* Stop counting; true when the armed failure happened. */
bool oom_disarm(void);
/* Stop counting for a while (Check's assertions allocate), returning what
 * is left of the count; oom_resume(left) goes on from there. */
long oom_pause(void);
void oom_resume(long left);
/* Blocks allocated and not yet freed, in the whole process. */
long oom_live(void);

#endif
