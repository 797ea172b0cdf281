/* static_load.c — a fully static program (cc -static ... libkvhal.a) asking kvhal to load a module: glibc cannot
 * load one into it, so kvhal must refuse with KVHAL_LOAD_FAILED and a message that says so (no crash), and the CPU
 * backend, built into the library, must still work. Usage: static_load <module.so> */
#include <kvhal/kvhal.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: static_load <module.so>\n");
        return 2;
    }
    kvhal_status st = kvhal_backend_load(argv[1]);
    if (st != KVHAL_LOAD_FAILED || !strstr(kvhal_last_error(), "statically linked")) {
        fprintf(stderr, "static_load: kvhal_backend_load: %s: %s\n", kvhal_status_name(st), kvhal_last_error());
        return 1;
    }
    printf("static_load: refused, as it must be: %s\n", kvhal_last_error());
    kvhal_buffer *b = NULL;
    if (kvhal_buffer_create((kvhal_device){KVHAL_DEVICE_CPU, 0}, 64, &b) != KVHAL_OK ||
        kvhal_buffer_destroy(b) != KVHAL_OK) {
        fprintf(stderr, "static_load: cpu:0: %s\n", kvhal_last_error());
        return 1;
    }
    printf("static_load: cpu:0 works in the static program\n");
    return 0;
}
