// A C++ consumer of the installed headers (.ci/consumers.sh builds it with g++ -std=c++17 -Wall -Wextra -pedantic
// -Werror): both public headers, the config initialisers, a cache created and destroyed on the CPU.
#include <kvhal/kvhal.h>
#include <kvhal/kvhal_backend.h>

#include <cstdio>
#include <cstring>

int main()
{
    std::printf("kvhal %s (header %s)\n", kvhal_version(), KVHAL_VERSION_STRING);
    if (std::strcmp(kvhal_version(), KVHAL_VERSION_STRING) != 0) return 1;
    kvhal_paged_cache_config cfg;
    kvhal_paged_cache_config_init(&cfg);
    cfg.num_layers = 1;
    cfg.num_heads = 2;
    cfg.head_dim = 8;
    cfg.block_size = 4;
    cfg.dtype = KVHAL_F16;
    cfg.memory_budget = 1 << 16;
    cfg.device = kvhal_device{KVHAL_DEVICE_CPU, 0};
    kvhal_paged_cache *c = nullptr;
    if (kvhal_paged_cache_create(&cfg, &c) != KVHAL_OK) {
        std::fprintf(stderr, "%s\n", kvhal_last_error());
        return 1;
    }
    std::printf("%lld blocks, plugin ABI %d, %zu-byte f16\n", (long long)kvhal_paged_cache_num_blocks(c),
                KVHAL_BACKEND_ABI_VERSION, kvhal_bk_dtype_size(KVHAL_F16));
    return kvhal_paged_cache_destroy(c) == KVHAL_OK ? 0 : 1;
}
