/*
sparse_buffer.cuh: a device buffer whose whole address range is reserved but only some byte
ranges of it are backed by GPU memory, through the CUDA driver's virtual memory API.

Why: under ZeRO-3 a rank keeps only its own part of the block matmul weights, yet every
kernel addresses the bf16 parameters as one flat vector by flat offset (llm.c order). So the
vector keeps its addresses and loses its memory: the address range of the whole buffer is
reserved (cuMemAddressReserve, no memory), and physical memory is created and mapped only
under the ranges the rank reads (zero.h's zero3_resident_ranges: every tensor but the matmul
weights, plus the rank's own range). The unmapped addresses are never touched; a stray access
there faults (an illegal address error) instead of reading another rank's stale values.

How:
- Each range gets its own physical allocation (cuMemCreate), mapped at base + begin
  (cuMemMap), then its handle is released at once (cuMemRelease): the mapping keeps the
  memory alive until cuMemUnmap, so freeing needs only the ranges. Read/write access is
  granted to `device` per range (cuMemSetAccess).
- Mappings are made in units of the allocation granularity. sparse_buffer_granularity asks
  for CU_MEM_ALLOC_GRANULARITY_MINIMUM (2 MiB on Hopper), the smallest unit cuMemMap
  accepts, so the rounding of each range pulls in as little of the unmapped weights as
  possible. RECOMMENDED (a performance hint, possibly larger) would only round more; each
  range is one large allocation either way.
- The binary must not link libcuda: CI machines have no driver and run the trainer's --help
  and CLI tests. The driver functions are looked up at run time through the runtime's
  cudaGetDriverEntryPointByVersion (cudaGetDriverEntryPoint is deprecated in CUDA 13), each
  at the version of its <cudaTypedefs.h> typedef; <cuda.h> is used for types only. The
  lookup happens on the first call, so a run that never makes a sparse buffer never asks.
- Errors: one line naming what the buffer is for, the driver call, its CUresult name
  (cuGetErrorName, looked up the same way) and, for a mapping, its size and place.
The device's context must be current (cudaSetDevice(device) as the trainer does). Freeing
unmaps (which waits for the device, like cudaFree): no kernel may still use the buffer.
*/
#ifndef LLMC_SPARSE_BUFFER_CUH
#define LLMC_SPARSE_BUFFER_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include "cuda_common.h"
#include "zero.h"

typedef struct {
    void* base;             // the start of the reserved range (NULL when not created)
    size_t reserved_bytes;  // the requested size rounded up to the granularity
    size_t mapped_bytes;    // backed by memory: the sum of the ranges
    int num_maps;
    ZeroRange* maps;        // the mapped byte ranges, relative to base (what freeing unmaps)
} SparseBuffer;

// ----------------------------------------------------------------------------
// the driver functions, found at run time

typedef struct {
    PFN_cuGetErrorName_v6000 get_error_name;
    PFN_cuMemGetAllocationGranularity_v10020 get_allocation_granularity;
    PFN_cuMemAddressReserve_v10020 address_reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
} SparseBufferDriver;

static inline void* sparse_buffer_driver_symbol(const char* symbol, unsigned int version) {
    void* function = NULL;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    cudaCheck(cudaGetDriverEntryPointByVersion(symbol, &function, version, cudaEnableDefault, &status));
    if (function == NULL || status != cudaDriverEntryPointSuccess) {
        llm8_die("the CUDA driver has no %s (ABI version %u, lookup status %d): sparse device buffers (ZeRO-3) need "
                 "the driver's virtual memory API", symbol, version, (int)status);
    }
    return function;
}

// the typedef's version suffix is the version asked for, so the pointer's type always matches
#define SPARSE_BUFFER_LOAD(field, symbol, version) \
    driver.field = (PFN_##symbol##_v##version)sparse_buffer_driver_symbol(#symbol, version)

static inline const SparseBufferDriver* sparse_buffer_driver(void) {
    static SparseBufferDriver driver;
    static int loaded = 0;
    if (!loaded) {
        SPARSE_BUFFER_LOAD(get_error_name, cuGetErrorName, 6000);
        SPARSE_BUFFER_LOAD(get_allocation_granularity, cuMemGetAllocationGranularity, 10020);
        SPARSE_BUFFER_LOAD(address_reserve, cuMemAddressReserve, 10020);
        SPARSE_BUFFER_LOAD(address_free, cuMemAddressFree, 10020);
        SPARSE_BUFFER_LOAD(create, cuMemCreate, 10020);
        SPARSE_BUFFER_LOAD(release, cuMemRelease, 10020);
        SPARSE_BUFFER_LOAD(map, cuMemMap, 10020);
        SPARSE_BUFFER_LOAD(unmap, cuMemUnmap, 10020);
        SPARSE_BUFFER_LOAD(set_access, cuMemSetAccess, 10020);
        loaded = 1;
    }
    return &driver;
}
#undef SPARSE_BUFFER_LOAD

// dies with one line when driver call `call` failed; `detail` says on what
static inline void sparse_buffer_check(CUresult result, const char* what, const char* call, const char* detail) {
    if (result == CUDA_SUCCESS) { return; }
    const char* name = NULL;
    if (sparse_buffer_driver()->get_error_name(result, &name) != CUDA_SUCCESS || name == NULL) { name = "unknown CUresult"; }
    llm8_die("%s: %s %s failed: %s (%d)%s", what, call, detail, name, (int)result,
             result == CUDA_ERROR_OUT_OF_MEMORY
                 ? "; out of GPU memory: lower the batch size (-b) or turn on activation recompute (-r)"
                 : "");
}

static inline CUmemAllocationProp sparse_buffer_allocation_prop(int device) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

// ----------------------------------------------------------------------------
// the buffer

// bytes: the unit mappings are made in on `device` (the driver's minimum granularity)
static inline size_t sparse_buffer_granularity(int device) {
    CUmemAllocationProp prop = sparse_buffer_allocation_prop(device);
    size_t granularity = 0;
    char detail[64];
    snprintf(detail, sizeof(detail), "(device %d, minimum)", device);
    sparse_buffer_check(sparse_buffer_driver()->get_allocation_granularity(&granularity, &prop,
                                                                           CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                        "sparse device buffer", "cuMemGetAllocationGranularity", detail);
    return granularity;
}

/*
Host-only: dies with one line naming `what` unless the byte ranges are non-empty, multiples of
`granularity` at both ends, sorted, disjoint and inside [0, reserved_bytes).
*/
static inline void sparse_buffer_check_ranges(size_t reserved_bytes, const ZeroRange* ranges, int n, size_t granularity,
                                              const char* what) {
    if (n < 0) { llm8_die("%s: %d mapped ranges (expected 0 or more)", what, n); }
    for (int k = 0; k < n; k++) {
        size_t begin = ranges[k].begin, end = ranges[k].end;
        if (begin >= end || end > reserved_bytes) {
            llm8_die("%s: mapped range %d is bytes [%zu, %zu) (expected a non-empty range inside the %zu reserved bytes)",
                     what, k, begin, end, reserved_bytes);
        }
        if (begin % granularity != 0 || end % granularity != 0) {
            llm8_die("%s: mapped range %d, bytes [%zu, %zu), is not on the %zu-byte allocation granularity", what, k,
                     begin, end, granularity);
        }
        if (k > 0 && begin < ranges[k - 1].end) {
            llm8_die("%s: mapped range %d, bytes [%zu, %zu), begins before range %d ends at %zu (expected sorted, "
                     "disjoint ranges)", what, k, begin, end, k - 1, ranges[k - 1].end);
        }
    }
}

/*
Reserves `bytes` (rounded up to the granularity) of addresses on `device` and backs each of
byte_ranges[0..n) (granule-aligned, sorted, disjoint: as zero3_resident_ranges returns them)
with its own memory, read/write for `device`. Addresses outside the ranges have no memory.
`what` names the buffer in errors.
*/
static inline void sparse_buffer_create(SparseBuffer* buf, size_t bytes, const ZeroRange* byte_ranges, int n, int device,
                                        const char* what) {
    if (bytes == 0) { llm8_die("%s: a sparse buffer of 0 bytes (expected > 0)", what); }
    const SparseBufferDriver* driver = sparse_buffer_driver();
    size_t granularity = sparse_buffer_granularity(device);
    size_t reserved_bytes = ceil_div_size(bytes, granularity) * granularity;
    sparse_buffer_check_ranges(reserved_bytes, byte_ranges, n, granularity, what);
    memset(buf, 0, sizeof(*buf));
    buf->reserved_bytes = reserved_bytes;
    buf->maps = (ZeroRange*)mallocCheck((size_t)(n > 0 ? n : 1) * sizeof(ZeroRange));
    char detail[256];
    CUdeviceptr base = 0;
    snprintf(detail, sizeof(detail), "of %.2f MiB", reserved_bytes / 1048576.0);
    sparse_buffer_check(driver->address_reserve(&base, reserved_bytes, granularity, 0, 0), what, "cuMemAddressReserve",
                        detail);
    buf->base = (void*)base;
    CUmemAllocationProp prop = sparse_buffer_allocation_prop(device);
    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int k = 0; k < n; k++) {
        size_t size = byte_ranges[k].end - byte_ranges[k].begin;
        CUdeviceptr at = base + byte_ranges[k].begin;
        snprintf(detail, sizeof(detail), "of %.2f MiB at bytes [%zu, %zu) of the %.2f MiB buffer on device %d (%.2f MiB "
                 "mapped before it)", size / 1048576.0, byte_ranges[k].begin, byte_ranges[k].end,
                 reserved_bytes / 1048576.0, device, buf->mapped_bytes / 1048576.0);
        CUmemGenericAllocationHandle handle;
        sparse_buffer_check(driver->create(&handle, size, &prop, 0), what, "cuMemCreate", detail);
        sparse_buffer_check(driver->map(at, size, 0, handle, 0), what, "cuMemMap", detail);
        sparse_buffer_check(driver->release(handle), what, "cuMemRelease", detail);
        sparse_buffer_check(driver->set_access(at, size, &access, 1), what, "cuMemSetAccess", detail);
        buf->maps[buf->num_maps++] = byte_ranges[k];
        buf->mapped_bytes += size;
    }
}

// unmaps every range (their memory goes back to the device), frees the addresses; a buffer
// never created or already freed (base NULL) is left alone
static inline void sparse_buffer_free(SparseBuffer* buf) {
    if (buf->base == NULL) { return; }
    const SparseBufferDriver* driver = sparse_buffer_driver();
    CUdeviceptr base = (CUdeviceptr)buf->base;
    char detail[96];
    for (int k = 0; k < buf->num_maps; k++) {
        snprintf(detail, sizeof(detail), "of bytes [%zu, %zu)", buf->maps[k].begin, buf->maps[k].end);
        sparse_buffer_check(driver->unmap(base + buf->maps[k].begin, buf->maps[k].end - buf->maps[k].begin),
                            "freeing a sparse device buffer", "cuMemUnmap", detail);
    }
    snprintf(detail, sizeof(detail), "of %.2f MiB", buf->reserved_bytes / 1048576.0);
    sparse_buffer_check(driver->address_free(base, buf->reserved_bytes), "freeing a sparse device buffer",
                        "cuMemAddressFree", detail);
    free(buf->maps);
    memset(buf, 0, sizeof(*buf));
}

#endif // LLMC_SPARSE_BUFFER_CUH
