/*
 * Shared test support (see harness.h). GPU suites initialise CUDA inside the
 * test process only after this gate, and run with CK_FORK=no semantics
 * (hkt_run sets no-fork for them), since CUDA does not survive fork().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader/driver.h"
#include "tests/harness.h"

int hkt_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

int hkt_gpu_or_skip(const char *suite) {
    hkl_driver d;
    char why[512];
    if (hkl_driver_open(&d, why, sizeof why) < 0) {
        printf("SKIP %s: no usable CUDA device (%s)\n", suite, why);
        return 0;
    }
    int n = 0;
    d.DeviceGetCount(&n);
    hkl_driver_close(&d);
    if (n < 1) {
        printf("SKIP %s: the CUDA driver reports no device\n", suite);
        return 0;
    }
    /* CUDA state must not cross fork(): run every test in this process. */
    setenv("CK_FORK", "no", 1);
    return 1;
}

char *hkt_tmpdir(void) {
    char tmpl[] = "/tmp/hotkern-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

int hkt_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

void hkt_rmtree(const char *path) {
    if (!path || strncmp(path, "/tmp/", 5))
        return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", path);
}
