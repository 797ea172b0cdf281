/* kvhal-info — what this kvhal sees: every backend module (path, ABI version, loaded or why not), every device
 * (name, memory), and the device KVHAL_DEVICE selects. --json for scripts. Exit status 1 when KVHAL_DEVICE is
 * invalid or names a device that is not present. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void usage(void)
{
    printf("usage: kvhal-info [--json]\n"
           "Lists backend modules, devices and the device selected by KVHAL_DEVICE.\n"
           "Environment: KVHAL_DEVICE (<type>[:N]: cpu, cuda:N, hip:N, opencl:N or a type a module registers),\n"
           "KVHAL_BACKEND_PATH (extra module folders),\n"
           "KVHAL_LOG (error|warn|info|debug).\n");
}

int main(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "kvhal-info: unknown argument '%s'\n", argv[i]);
            usage();
            return 2;
        }
    }
    int32_t nmod = 0;
    kvhal_backend_module_count(&nmod);
    kvhal_device sel;
    kvhal_status sel_st = kvhal_device_default(&sel);
    char sel_err[1024];
    snprintf(sel_err, sizeof sel_err, "%s", kvhal_last_error());
    const char *env = getenv("KVHAL_DEVICE");

    if (json) printf("{\"version\":\"%d.%d.%d\",\"modules\":[", KVHAL_VERSION_MAJOR, KVHAL_VERSION_MINOR, KVHAL_VERSION_PATCH);
    else printf("kvhal %d.%d.%d\n\nBackend modules:\n", KVHAL_VERSION_MAJOR, KVHAL_VERSION_MINOR, KVHAL_VERSION_PATCH);
    for (int32_t i = 0; i < nmod; i++) {
        kvhal_backend_module_info mi;
        if (kvhal_backend_module_get(i, &mi) != KVHAL_OK) continue;
        if (json) {
            printf("%s{\"name\":", i ? "," : "");
            json_str(mi.name);
            printf(",\"device_type\":");
            json_str(mi.device_type);
            printf(",\"type_id\":%d,\"path\":", (int)mi.type_id);
            json_str(mi.path);
            printf(",\"abi_version\":%u,\"loaded\":%s,\"devices\":%d,\"reason\":", mi.abi_version,
                   mi.loaded ? "true" : "false", mi.device_count);
            json_str(mi.reason);
            printf("}");
        } else {
            printf("  %-7s %s\n          ABI %u, %s", mi.name, mi.path, mi.abi_version, mi.loaded ? "loaded" : "NOT loaded");
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
                json_str(info.name);
                printf(",\"platform\":");
                json_str(info.platform);
                printf(",\"total_memory\":%llu,\"free_memory\":%llu,\"compute_units\":%d,\"peer_access\":%s}",
                       (unsigned long long)info.total_memory, (unsigned long long)info.free_memory,
                       info.compute_units, info.peer_access ? "true" : "false");
            } else {
                printf("  %s:%d  %s\n", kvhal_device_type_name(d.type), id, info.name);
                printf("          %s | %.1f GiB total, %.1f GiB free | %d compute units%s\n", info.platform, (double)info.total_memory / (1 << 30), (double)info.free_memory / (1 << 30),
                       info.compute_units, info.peer_access ? " | peer access" : "");
            }
            first = 0;
        }
    }
    if (json) {
        printf("],\"KVHAL_DEVICE\":");
        if (env) json_str(env);
        else printf("null");
        printf(",\"selected\":");
        if (sel_st == KVHAL_OK) printf("\"%s:%d\"", kvhal_device_type_name(sel.type), sel.id);
        else printf("null");
        printf(",\"error\":");
        if (sel_st == KVHAL_OK) printf("null");
        else json_str(sel_err);
        printf("}\n");
    } else {
        printf("\nSelected (KVHAL_DEVICE=%s): ", env ? env : "(unset)");
        if (sel_st == KVHAL_OK) printf("%s:%d\n", kvhal_device_type_name(sel.type), sel.id);
        else printf("none\n  %s\n", sel_err);
    }
    return sel_st == KVHAL_OK ? 0 : 1;
}
