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

    tool_json j;
    tool_json_init(&j, stdout);
    if (json) {
        tool_json_head(&j, tool, sel_st == KVHAL_OK);
        if (sel_st != KVHAL_OK) /* the failure object's error, the lists below kept for diagnosis */
            tool_json_error(&j, kvhal_status_name(sel_st), sel_err);
        tool_json_open_array(&j, "modules");
    } else {
        printf("kvhal %s\n\nBackend modules:\n", kvhal_version());
    }
    for (int32_t i = 0; i < nmod; i++) {
        kvhal_backend_module_info mi;
        if (kvhal_backend_module_get(i, &mi) != KVHAL_OK) continue;
        if (json) {
            tool_json_open(&j, NULL);
            tool_json_key_str(&j, "name", mi.name);
            tool_json_key_str(&j, "device_type", mi.device_type);
            tool_json_key_int(&j, "type_id", mi.type_id);
            tool_json_key_str(&j, "path", mi.path);
            tool_json_key_num(&j, "abi_version", mi.abi_version, mi.abi_version != 0); /* null: refused unread */
            tool_json_key_bool(&j, "loaded", mi.loaded);
            tool_json_key_int(&j, "devices", mi.device_count);
            tool_json_key_str(&j, "reason", mi.reason);
            tool_json_close(&j);
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
    if (json) {
        tool_json_close_array(&j);
        tool_json_open_array(&j, "devices");
    } else {
        printf("\nDevices:\n");
    }
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
                char name[48];
                kvhal_device_format(d, name, sizeof name);
                tool_json_open(&j, NULL);
                tool_json_key_str(&j, "device", name);
                tool_json_key_str(&j, "name", info.name);
                tool_json_key_str(&j, "platform", info.platform);
                /* 0: the runtime cannot tell (null, not 0) */
                tool_json_key_num(&j, "total_memory", (double)info.total_memory, info.total_memory != 0);
                tool_json_key_num(&j, "free_memory", (double)info.free_memory, info.free_memory != 0);
                tool_json_key_int(&j, "compute_units", info.compute_units);
                tool_json_key_bool(&j, "peer_access", info.peer_access);
                tool_json_close(&j);
            } else {
                printf("  %s:%d  %s\n", kvhal_device_type_name(d.type), id, info.name);
                char tot[32], fr[32];
                printf("          %s | %s total, %s free | %d compute units%s\n", info.platform,
                       gib(info.total_memory, tot, sizeof tot), gib(info.free_memory, fr, sizeof fr),
                       info.compute_units, info.peer_access ? " | peer access" : "");
            }
        }
    }
    if (json) {
        tool_json_close_array(&j);
        tool_json_key_str(&j, "KVHAL_DEVICE", env);
        char selname[48] = "";
        if (sel_st == KVHAL_OK) kvhal_device_format(sel, selname, sizeof selname);
        tool_json_key_str(&j, "selected", sel_st == KVHAL_OK ? selname : NULL);
        tool_json_close(&j);
    } else {
        printf("\nSelected (KVHAL_DEVICE=%s): ", env ? env : "(unset)");
        if (sel_st == KVHAL_OK) printf("%s:%d\n", kvhal_device_type_name(sel.type), sel.id);
        else printf("none\n");
    }
    if (sel_st != KVHAL_OK) tool_error(tool, "KVHAL_DEVICE: %s", sel_err);
    return sel_st == KVHAL_OK ? TOOL_EXIT_OK : TOOL_EXIT_FAILED;
}
