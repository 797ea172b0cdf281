/* kvhal-conformance — runs every op of every registered device type (the built-in ones and those the loaded modules
 * register) on every device present, or on the devices --device names, against a plain host reference
 * (reference.c), and prints a table (or --json). Exit status 0 when every check passed (skipped ones aside), 1 when
 * a check failed (each failure named on stderr with its device, check and op) or a named device is not present,
 * 2 on a usage error. The checks themselves are in checks.c; check.h says how a check fails or skips. */
#include <getopt.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kvhal.h"
#include "tool_common.h"

static const char *const tool = "kvhal-conformance";

enum { RES_PASS, RES_FAIL, RES_SKIP };
static const char *const res_names[] = {"pass", "FAIL", "skip"};
static const char *const res_json[] = {"pass", "fail", "skip"};

/* The running check: where a failing assertion jumps to and what it said. */
static struct {
    jmp_buf jb;
    char msg[2048];
    const char *device, *check; /* for the crash message */
} cur;

void conf_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cur.msg, sizeof cur.msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof cur.msg) {
        const char *base = strrchr(file, '/');
        snprintf(cur.msg + n, sizeof cur.msg - (size_t)n, " (%s:%d)", base ? base + 1 : file, line);
    }
    longjmp(cur.jb, 1 + RES_FAIL);
}

void conf_skip(const char *why)
{
    snprintf(cur.msg, sizeof cur.msg, "%s", why ? why : "not applicable");
    longjmp(cur.jb, 1 + RES_SKIP);
}

void conf_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cur.msg, sizeof cur.msg, fmt, ap);
    va_end(ap);
}

/* A module that crashes in a check: say which device and check before the process dies of the signal. */
static void on_crash(int sig)
{
    char line[256];
    int n = snprintf(line, sizeof line, "%s: error: %s: check %s crashed (signal %d)\n", tool,
                     cur.device ? cur.device : "?", cur.check ? cur.check : "?", sig);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

typedef struct result {
    char device[KVHAL_DEVICE_TYPE_NAME_MAX + 16];
    const conf_check *check; /* NULL: a device type with no device */
    int res;
    double seconds;
    char *msg;
} result;

static struct {
    result *v;
    size_t n, cap;
    int json;
} out;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static result *add_result(const char *device, const conf_check *c, int res, const char *msg)
{
    if (out.n == out.cap) {
        size_t cap = out.cap ? 2 * out.cap : 64;
        result *v = realloc(out.v, cap * sizeof *v);
        if (!v) return NULL;
        out.v = v;
        out.cap = cap;
    }
    result *r = &out.v[out.n++];
    snprintf(r->device, sizeof r->device, "%s", device);
    r->check = c;
    r->res = res;
    r->seconds = 0;
    r->msg = msg && *msg ? strdup(msg) : NULL;
    return r;
}

static void print_row(const result *r)
{
    if (out.json) return;
    if (r->check)
        printf("%-12s %-22s %-30s %-5s %8.3f\n", r->device, r->check->name, r->check->op, res_names[r->res],
               r->seconds);
    else
        printf("%-12s %-22s %-30s %-5s\n", r->device, "-", "-", res_names[r->res]);
    if (r->msg) printf("    %s\n", r->msg);
    fflush(stdout);
}

/* Runs check c with state pointing at dev (NULL for a host check) and records it under label. */
static void run_check(const char *label, const conf_check *c, kvhal_device *dev)
{
    cur.device = label;
    cur.check = c->name;
    cur.msg[0] = '\0';
    void *state = dev;
    const double t0 = now();
    volatile int res = RES_PASS;
    int j = setjmp(cur.jb);
    if (j == 0) c->fn(&state);
    else res = j - 1;
    result *r = add_result(label, c, res, cur.msg);
    if (!r) return;
    r->seconds = now() - t0;
    print_row(r);
    if (res == RES_FAIL)
        fprintf(stderr, "%s: error: %s: op %s failed (check %s): %s\n", tool, label, c->op, c->name, cur.msg);
    /* a failed check may leave an error or work behind: start the next from a quiet device */
    if (res == RES_FAIL && dev) (void)kvhal_device_synchronize(*dev);
}

static void run_device(kvhal_device dev)
{
    char label[KVHAL_DEVICE_TYPE_NAME_MAX + 16];
    kvhal_device_format(dev, label, sizeof label);
    kvhal_device_info info;
    if (!out.json) {
        if (kvhal_device_get_info(dev, &info) == KVHAL_OK)
            printf("# %s = %s (%s)\n", label, info.name, info.platform);
    }
    for (size_t i = 0; i < conf_num_device_checks; i++) run_check(label, &conf_device_checks[i], &dev);
}

static void usage(void)
{
    printf("usage: kvhal-conformance [options]\n"
           "Runs every op of every registered device type on every device present (or on the devices --device\n"
           "names) against a plain host reference, and the number-format conversions, and prints one row per check.\n"
           "  -d, --device=TYPE:N  run on this device only (repeatable), e.g. --device=npu:0; a device that is not\n"
           "                       present is an error\n"
           "  -j, --json           one JSON object on stdout instead of the table\n"
           "  -L, --list           the checks and the op each exercises, then exit\n"
           "  -h, --help           this text\n"
           "  -V, --version        \"kvhal-conformance <kvhal version>\"\n"
           "Exit status: 0 every check passed (a check a device cannot run is skipped, and says why), 1 a check failed\n"
           "(each failure is named on stderr: device, op, check, message) or a named device is not present, 2 usage.\n"
           "Environment: KVHAL_BACKEND_PATH (module folders, e.g. a vendor's libkvhal-<name>.so), KVHAL_BACKENDS\n"
           "(only these modules load), KVHAL_LOG (error|warn|info|debug).\n");
}

static void list_checks(void)
{
    for (size_t i = 0; i < conf_num_host_checks; i++)
        printf("host\t%s\t%s\n", conf_host_checks[i].name, conf_host_checks[i].op);
    for (size_t i = 0; i < conf_num_device_checks; i++)
        printf("device\t%s\t%s\n", conf_device_checks[i].name, conf_device_checks[i].op);
}

static void print_json(int ok, size_t counts[3])
{
    printf("{\"ok\":%s,\"version\":", ok ? "true" : "false");
    tool_json_str(stdout, kvhal_version());
    printf(",\"passed\":%zu,\"failed\":%zu,\"skipped\":%zu,\"checks\":[", counts[RES_PASS], counts[RES_FAIL],
           counts[RES_SKIP]);
    for (size_t i = 0; i < out.n; i++) {
        const result *r = &out.v[i];
        printf("%s{\"device\":", i ? "," : "");
        tool_json_str(stdout, r->device);
        printf(",\"check\":");
        if (r->check) tool_json_str(stdout, r->check->name);
        else printf("null");
        printf(",\"op\":");
        if (r->check) tool_json_str(stdout, r->check->op);
        else printf("null");
        printf(",\"result\":\"%s\",\"seconds\":", res_json[r->res]);
        tool_json_num(stdout, r->seconds, r->check != NULL);
        printf(",\"message\":");
        if (r->msg) tool_json_str(stdout, r->msg);
        else printf("null");
        printf("}");
    }
    printf("]}\n");
}

int main(int argc, char **argv)
{
    kvhal_device only[64];
    const char *only_text[64];
    int nonly = 0, list = 0;
    static const struct option longopts[] = {
        {"device", required_argument, NULL, 'd'}, {"json", no_argument, NULL, 'j'},
        {"list", no_argument, NULL, 'L'},         {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},      {NULL, 0, NULL, 0},
    };
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":d:jLhV", longopts, NULL)) != -1;) {
        switch (c) {
        case 'd':
            if (nonly == (int)(sizeof only / sizeof only[0])) return tool_usage_error(tool, "too many --device");
            only_text[nonly++] = optarg; /* parsed once the modules have registered their device types */
            break;
        case 'j': out.json = 1; break;
        case 'L': list = 1; break;
        case 'h': usage(); return TOOL_EXIT_OK;
        case 'V': tool_print_version(tool); return TOOL_EXIT_OK;
        case ':': return tool_usage_error(tool, "option '%s' needs an argument", argv[optind - 1]);
        default: return tool_usage_error(tool, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return tool_usage_error(tool, "unexpected argument '%s'", argv[optind]);
    if (list) {
        list_checks();
        return TOOL_EXIT_OK;
    }
    int32_t nmod = 0;
    kvhal_backend_module_count(&nmod); /* loads the modules, so that their device types are registered */
    for (int i = 0; i < nonly; i++)
        if (kvhal_device_parse(only_text[i], &only[i]) != KVHAL_OK)
            return tool_usage_error(tool, "--device=%s: %s", only_text[i], kvhal_last_error());
    for (int i = 0; i < nonly; i++) {
        int32_t count = 0;
        if (kvhal_device_count(only[i].type, &count) != KVHAL_OK || only[i].id >= count) {
            char name[KVHAL_DEVICE_TYPE_NAME_MAX + 16];
            kvhal_device_format(only[i], name, sizeof name);
            tool_error(tool, "--device=%s: not present (%d %s device%s; see kvhal-info)", name, (int)count,
                       kvhal_device_type_name(only[i].type), count == 1 ? "" : "s");
            if (out.json) tool_json_failure(stdout, tool, "KVHAL_NOT_FOUND", "a device --device names is not present");
            return TOOL_EXIT_FAILED;
        }
    }
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], on_crash);

    if (!out.json) {
        printf("%s %s\n", tool, kvhal_version());
        printf("%-12s %-22s %-30s %-5s %8s\n", "device", "check", "op", "result", "seconds");
    }
    for (size_t i = 0; i < conf_num_host_checks; i++) run_check("host", &conf_host_checks[i], NULL);
    int devices_run = 0;
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        const kvhal_device_type type = (kvhal_device_type)t;
        const char *tn = kvhal_device_type_name(type);
        if (!strcmp(tn, "invalid")) continue;
        int32_t count = 0;
        if (kvhal_device_count(type, &count) != KVHAL_OK) count = 0;
        if (count == 0 && nonly == 0) {
            char why[64];
            snprintf(why, sizeof why, "no %s device", tn);
            const result *r = add_result(tn, NULL, RES_SKIP, why);
            if (r) print_row(r);
            continue;
        }
        for (int32_t id = 0; id < count; id++) {
            bool run = nonly == 0;
            for (int i = 0; i < nonly; i++) run |= only[i].type == type && only[i].id == id;
            if (!run) continue;
            run_device((kvhal_device){type, id});
            devices_run++;
        }
    }
    size_t counts[3] = {0, 0, 0};
    for (size_t i = 0; i < out.n; i++) counts[out.v[i].res]++;
    const int ok = counts[RES_FAIL] == 0 && devices_run > 0;
    if (out.json) print_json(ok, counts);
    else
        printf("%s: %zu passed, %zu failed, %zu skipped on %d device%s\n", ok ? "PASSED" : "FAILED",
               counts[RES_PASS], counts[RES_FAIL], counts[RES_SKIP], devices_run, devices_run == 1 ? "" : "s");
    if (devices_run == 0) tool_error(tool, "no device ran the checks");
    for (size_t i = 0; i < out.n; i++) free(out.v[i].msg);
    free(out.v);
    return ok ? TOOL_EXIT_OK : TOOL_EXIT_FAILED;
}
