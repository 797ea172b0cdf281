// cpp_config_init.cc — the README's first snippet in C++: the *_CONFIG_INIT initialisers compile without a warning
// (-Wall -Wextra -Wpedantic -Werror) in C++11, C++17 and C++20 (tests/meson.build builds this file for each), give
// struct_size and zero elsewhere, and a paged cache made from one works.
#include <kvhal/kvhal.h>

#include <cstdio>
#include <cstring>

int main()
{
    kvhal_paged_cache_config cfg = KVHAL_PAGED_CACHE_CONFIG_INIT;
    kvhal_static_cache_config sc = KVHAL_STATIC_CACHE_CONFIG_INIT;
    kvhal_kv_cache_config kc = KVHAL_KV_CACHE_CONFIG_INIT;
    if (cfg.struct_size != sizeof cfg || sc.struct_size != sizeof sc || kc.struct_size != sizeof kc) {
        std::fprintf(stderr, "cpp_config_init: struct_size not set\n");
        return 1;
    }
    kvhal_paged_cache_config zero;
    std::memset(&zero, 0, sizeof zero);
    zero.struct_size = sizeof zero;
    if (cfg.num_layers != 0 || cfg.memory_budget != 0 || cfg.device.id != zero.device.id) {
        std::fprintf(stderr, "cpp_config_init: a field is not zero\n");
        return 1;
    }
    cfg.num_layers = 2;
    cfg.num_heads = 2;
    cfg.head_dim = 8;
    cfg.block_size = 16;
    cfg.dtype = KVHAL_F16;
    cfg.memory_budget = 1 << 20;
    cfg.device = kvhal_device{KVHAL_DEVICE_CPU, 0};
    kvhal_paged_cache *cache = nullptr;
    if (kvhal_paged_cache_create(&cfg, &cache) != KVHAL_OK) {
        std::fprintf(stderr, "cpp_config_init: %s\n", kvhal_last_error());
        return 1;
    }
    std::printf("C++ %ld: KVHAL_*_CONFIG_INIT, a paged cache of %lld blocks\n", static_cast<long>(__cplusplus),
                static_cast<long long>(kvhal_paged_cache_num_blocks(cache)));
    return kvhal_paged_cache_destroy(cache) == KVHAL_OK ? 0 : 1;
}
