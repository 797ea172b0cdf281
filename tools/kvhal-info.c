/* kvhal-info — what this kvhal sees: every backend module (path, ABI version, loaded or why not), every device
 * (name, memory), and the device KVHAL_DEVICE selects. --json for scripts, -l a terse device list. Exit status 1
 * when KVHAL_DEVICE is invalid or names a device that is not present, 2 on a usage error (README, "Tools"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <getopt.h>

#include "kvhal.h"
#include "tool_common.h"

static const char *const tool = "kvhal-info";

static void usage(void)
{
    printf("usage: kvhal-info [options]\n"
           "Lists backend modules, devices and the device selected by KVHAL_DEVICE.\n"
           "  -j, --json      one JSON object on stdout\n"
           "  -l, --list      terse device list: one line per present device, \"<device>\\t<name>\"\n"
           "  -h, --help      this text\n"
           "  -V, --version   \"kvhal-info <kvhal version>\"\n"
           "Exit status: 0 success, 1 KVHAL_DEVICE is invalid or names a device that is not present, 2 usage.\n"
           "Environment: KVHAL_DEVICE (<type>[:N]: cpu, cuda:N, hip:N, opencl:N or a type a module registers),\n"
           "KVHAL_BACKEND_PATH (extra module folders), KVHAL_BACKENDS (only these modules load),\n"
           "KVHAL_LOG (error|warn|info|debug).\n");
}

/* -l: "cuda:0<TAB>NVIDIA H100 80GB HBM3", one line per present device; exit status 1 (after the list) when
 * KVHAL_DEVICE is invalid, as without -l. */
static int list_devices(void)
{
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        int32_t n = 0;
        if (kvhal_device_count((kvhal_device_type)t, &n) != KVHAL_OK) break; /* past the registered types */
        for (int32_t id = 0; id < n; id++) {
            kvhal_device d = {(kvhal_device_type)t, id};
            kvhal_device_info info;
            char name[48];
            kvhal_device_format(d, name, sizeof name);
            if (kvhal_device_get_info(d, &info) != KVHAL_OK) printf("%s\t(info failed: %s)\n", name, kvhal_last_error());
            else printf("%s\t%s\n", name, info.name);
        }
    }
    kvhal_device sel;
    if (kvhal_device_default(&sel) != KVHAL_OK) {
        tool_error(tool, "KVHAL_DEVICE: %s", kvhal_last_error());
        return TOOL_EXIT_FAILED;
    }
    return TOOL_EXIT_OK;
}

/* "12.5 GiB" into buf, or "unknown" when the runtime cannot tell (0). */
static const char *gib(uint64_t bytes, char *buf, size_t cap)
{
    if (bytes == 0) snprintf(buf, cap, "unknown");
    else snprintf(buf, cap, "%.1f GiB", (double)bytes / (1 << 30));
    return buf;
}

static int run(int argc, char **argv);

int main(int argc, char **argv)
{
    tool_stdout_guard();
    return tool_exit(tool, run(argc, argv));
}

static int run(int argc, char **argv)
{
    int json = 0, list = 0;
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},    {"list", no_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},    {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":jlhV", longopts, NULL)) != -1;) {
        switch (c) {
        case 'j': json = 1; break;
        case 'l': list = 1; break;
        case 'h': usage(); return TOOL_EXIT_OK;
        case 'V': tool_print_version(tool); return TOOL_EXIT_OK;
        default: return tool_usage_error(tool, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return tool_usage_error(tool, "unexpected argument '%s'", argv[optind]);
    if (json && list) return tool_usage_error(tool, "--json and --list exclude each other");
    if (list) return list_devices();
    int32_t nmod = 0;
    kvhal_backend_module_count(&nmod);
    kvhal_device sel;
    kvhal_status sel_st = kvhal_device_default(&sel);
    char sel_err[1024];
    snprintf(sel_err, sizeof sel_err, "%s", kvhal_last_error());
    const char *env = getenv("KVHAL_DEVICE");

    if (json) {
        printf("{\"ok\":%s,\"tool\":\"%s\",\"version\":", sel_st == KVHAL_OK ? "true" : "false", tool);
        tool_json_str(stdout, kvhal_version());
        printf(",\"modules\":[");
    } else {
        printf("kvhal %s\n\nBackend modules:\n", kvhal_version());
    }
    for (int32_t i = 0; i < nmod; i++) {
        kvhal_backend_module_info mi;
        if (kvhal_backend_module_get(i, &mi) != KVHAL_OK) continue;
        if (json) {
            printf("%s{\"name\":", i ? "," : "");
            tool_json_str(stdout, mi.name);
            printf(",\"device_type\":");
            tool_json_str(stdout, mi.device_type);
            printf(",\"type_id\":%d,\"path\":", (int)mi.type_id);
            tool_json_str(stdout, mi.path);
            printf(",\"abi_version\":");
            tool_json_num(stdout, mi.abi_version, mi.abi_version != 0);
            printf(",\"loaded\":%s,\"devices\":%d,\"reason\":",
                   mi.loaded ? "true" : "false", mi.device_count);
            tool_json_str(stdout, mi.reason);
            printf("}");
        } else {
            /* ABI 0: the module was refused before its version was read */
            if (mi.abi_version) printf("  %-7s %s\n          ABI %u, %s", mi.name, mi.path, mi.abi_version,
                                       mi.loaded ? "loaded" : "NOT loaded");
            else printf("  %-7s %s\n          ABI not read, %s", mi.name, mi.path, mi.loaded ? "loaded" : "NOT loaded");
            if (mi.loaded) printf(", device type %s (id %d)", mi.device_type, (int)mi.type_id);
            if (mi.loaded) printf(", %d device%s", mi.device_count, mi.device_count == 1 ? "" : "s");
            if (mi.reason[0]) printf(" (%s)", mi.reason);
            printf("\n");
        }
    }
    if (json) printf("],\"devices\":[");
    else printf("\nDevices:\n");
    int first = 1;
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        int32_t n = 0;
        if (kvhal_device_count((kvhal_device_type)t, &n) != KVHAL_OK) break; /* past the registered types */
        for (int32_t id = 0; id < n; id++) {
            kvhal_device d = {(kvhal_device_type)t, id};
            kvhal_device_info info;
            if (kvhal_device_get_info(d, &info) != KVHAL_OK) {
                if (!json) printf("  %s:%d  (info failed: %s)\n", kvhal_device_type_name(d.type), id, kvhal_last_error());
                continue;
            }
            if (json) {
                printf("%s{\"device\":\"%s:%d\",\"name\":", first ? "" : ",", kvhal_device_type_name(d.type), id);
                tool_json_str(stdout, info.name);
                printf(",\"platform\":");
                tool_json_str(stdout, info.platform);
                /* free_memory 0: the runtime cannot tell (null, not 0) */
                printf(",\"total_memory\":");
                tool_json_num(stdout, (double)info.total_memory, info.total_memory != 0);
                printf(",\"free_memory\":");
                tool_json_num(stdout, (double)info.free_memory, info.free_memory != 0);
                printf(",\"compute_units\":%d,\"peer_access\":%s}", info.compute_units,
                       info.peer_access ? "true" : "false");
            } else {
                printf("  %s:%d  %s\n", kvhal_device_type_name(d.type), id, info.name);
                char tot[32], fr[32];
                printf("          %s | %s total, %s free | %d compute units%s\n", info.platform,
                       gib(info.total_memory, tot, sizeof tot), gib(info.free_memory, fr, sizeof fr),
                       info.compute_units, info.peer_access ? " | peer access" : "");
            }
            first = 0;
        }
    }
    if (json) {
        printf("],\"KVHAL_DEVICE\":");
        if (env) tool_json_str(stdout, env);
        else printf("null");
        printf(",\"selected\":");
        if (sel_st == KVHAL_OK) printf("\"%s:%d\"", kvhal_device_type_name(sel.type), sel.id);
        else printf("null");
        if (sel_st != KVHAL_OK) { /* the failure object's error, the lists above kept for diagnosis */
            printf(",\"error\":{\"status\":");
            tool_json_str(stdout, kvhal_status_name(sel_st));
            printf(",\"message\":");
            tool_json_str(stdout, sel_err);
            printf("}");
        }
        printf("}\n");
    } else {
        printf("\nSelected (KVHAL_DEVICE=%s): ", env ? env : "(unset)");
        if (sel_st == KVHAL_OK) printf("%s:%d\n", kvhal_device_type_name(sel.type), sel.id);
        else printf("none\n");
    }
    if (sel_st != KVHAL_OK) tool_error(tool, "KVHAL_DEVICE: %s", sel_err);
    return sel_st == KVHAL_OK ? TOOL_EXIT_OK : TOOL_EXIT_FAILED;
}
