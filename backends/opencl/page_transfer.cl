/* page_transfer.cl — page_transfer needs no kernel: ocl_page_transfer.c enqueues the runtime's rectangular
 * buffer reads and writes (one per page when the caches are evenly spaced in one buffer), which go to the copy
 * engine on GPUs and to host memcpy on CPU devices. The op list makes every op carry a .cl file; this one holds
 * no kernel and is never built. */
