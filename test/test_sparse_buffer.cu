/*
test_sparse_buffer.cu: llmc/sparse_buffer.cuh on the GPU.
- a buffer with three mapped ranges out of eleven granules: sizes, alignment, kernels writing
  and reading inside the ranges, cudaMemset and cudaMemcpy on them, free and create again;
- the ZeRO-3 use: d12's bf16 parameters with 8 ranks, rank 3's zero3_resident_ranges mapped,
  every resident element written and read back by flat index, the device's free memory down
  by the mapped bytes, not the reserved ones;
- an unmapped address has no memory: a kernel writing there faults (in a child process forked
  before this process touches CUDA);
- bad ranges die with one line naming the buffer (host-only checks): unaligned at either end,
  empty, overlapping, past the end, a negative count; adjacent ranges are accepted; a driver
  out-of-memory error carries the hint;
- free gives every mapped byte back (the device's free memory as before create).
*/
#include "llmc/sparse_buffer.cuh"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"
#include "test/gpu_test_copies.cuh"

#define DEVICE 0
#define THREADS 256

// what the kernels write at word (or element) index `index`, and the host expects
static __host__ __device__ uint32_t word_pattern(size_t index, uint32_t seed) { return (uint32_t)(index * 2654435761u) ^ seed; }

// ranges in bytes (multiples of 4): block row y fills range y's words with the pattern of their word index
__global__ void fill_words_kernel(uint32_t* base, const ZeroRange* ranges, uint32_t seed) {
    ZeroRange range = ranges[blockIdx.y];
    for (size_t w = range.begin / 4 + blockIdx.x * blockDim.x + threadIdx.x; w < range.end / 4; w += gridDim.x * blockDim.x) {
        base[w] = word_pattern(w, seed);
    }
}

// reads every word of the ranges (in order) into `packed`, one after the other
__global__ void gather_words_kernel(const uint32_t* base, const ZeroRange* ranges, const size_t* packed_offsets,
                                    uint32_t* packed) {
    ZeroRange range = ranges[blockIdx.y];
    for (size_t w = range.begin / 4 + blockIdx.x * blockDim.x + threadIdx.x; w < range.end / 4; w += gridDim.x * blockDim.x) {
        packed[packed_offsets[blockIdx.y] + w - range.begin / 4] = base[w];
    }
}

// bf16 elements [begin, end) of each element range: the low 16 bits of the pattern of their flat index
__global__ void fill_elements_kernel(uint16_t* params, const ZeroRange* ranges, uint32_t seed) {
    ZeroRange range = ranges[blockIdx.y];
    for (size_t i = range.begin + blockIdx.x * blockDim.x + threadIdx.x; i < range.end; i += gridDim.x * blockDim.x) {
        params[i] = (uint16_t)word_pattern(i, seed);
    }
}

__global__ void write_word_kernel(uint32_t* at) { *at = 1u; }

// a kernel writing into an unmapped granule faults: the addresses outside the ranges have no memory
static void run_unmapped_write(void) {
    cudaCheck(cudaSetDevice(DEVICE));
    size_t g = sparse_buffer_granularity(DEVICE);
    ZeroRange mapped = {0, g};
    SparseBuffer buf;
    sparse_buffer_create(&buf, 2 * g, &mapped, 1, DEVICE, "unmapped write test");
    write_word_kernel<<<1, 1>>>((uint32_t*)((char*)buf.base + g + 64));
    cudaCheck(cudaDeviceSynchronize());
}

static void test_three_ranges(size_t g) {
    const ZeroRange ranges[3] = {{0, g}, {3 * g, 5 * g}, {8 * g, 11 * g}};
    SparseBuffer buf;
    sparse_buffer_create(&buf, 10 * g + 123, ranges, 3, DEVICE, "three-range test buffer");
    CHECK(buf.base != NULL && (uintptr_t)buf.base % g == 0, "base %p not on the %zu-byte granularity", buf.base, g);
    CHECK(buf.reserved_bytes == 11 * g, "reserved %zu bytes, expected %zu (10 g + 123 rounded up)", buf.reserved_bytes, 11 * g);
    CHECK(buf.mapped_bytes == 6 * g && buf.num_maps == 3, "mapped %zu bytes in %d maps, expected %zu in 3",
          buf.mapped_bytes, buf.num_maps, 6 * g);
    ZeroRange* d_ranges = (ZeroRange*)device_copy(ranges, sizeof(ranges));
    size_t offsets[3] = {0, g / 4, 3 * g / 4};  // each range's first word in the packed copy
    size_t* d_offsets = (size_t*)device_copy(offsets, sizeof(offsets));
    uint32_t* d_packed = (uint32_t*)cuda_malloc_checked(6 * g, "packed copy");
    const uint32_t seed = 0x5eedu;
    fill_words_kernel<<<dim3(64, 3), THREADS>>>((uint32_t*)buf.base, d_ranges, seed);
    cudaCheck(cudaGetLastError());
    gather_words_kernel<<<dim3(64, 3), THREADS>>>((const uint32_t*)buf.base, d_ranges, d_offsets, d_packed);
    cudaCheck(cudaGetLastError());
    uint32_t* packed = (uint32_t*)mallocCheck(6 * g);
    cudaCheck(cudaMemcpy(packed, d_packed, 6 * g, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (int k = 0; k < 3; k++) {
        for (size_t w = ranges[k].begin / 4; w < ranges[k].end / 4; w++) {
            wrong += packed[offsets[k] + w - ranges[k].begin / 4] != word_pattern(w, seed);
        }
    }
    CHECK(wrong == 0, "three ranges: %zu words read back by a kernel differ from what a kernel wrote", wrong);
    // the runtime's memset and memcpy on a mapped range
    cudaCheck(cudaMemset((char*)buf.base + ranges[1].begin, 0x5a, ranges[1].end - ranges[1].begin));
    cudaCheck(cudaMemcpy(packed, (char*)buf.base + ranges[1].begin, ranges[1].end - ranges[1].begin, cudaMemcpyDeviceToHost));
    wrong = 0;
    for (size_t w = 0; w < (ranges[1].end - ranges[1].begin) / 4; w++) { wrong += packed[w] != 0x5a5a5a5au; }
    CHECK(wrong == 0, "three ranges: %zu words differ after cudaMemset of range 1", wrong);
    cudaCheck(cudaMemcpy(packed, (char*)buf.base + ranges[2].begin, ranges[2].end - ranges[2].begin, cudaMemcpyDeviceToHost));
    wrong = 0;
    for (size_t w = 0; w < (ranges[2].end - ranges[2].begin) / 4; w++) {
        wrong += packed[w] != word_pattern(ranges[2].begin / 4 + w, seed);
    }
    CHECK(wrong == 0, "three ranges: %zu words of range 2 differ (cudaMemcpy), or the memset of range 1 reached it", wrong);
    sparse_buffer_free(&buf);
    CHECK(buf.base == NULL && buf.mapped_bytes == 0 && buf.num_maps == 0, "free left base %p, %zu mapped bytes", buf.base,
          buf.mapped_bytes);
    sparse_buffer_free(&buf);  // a freed buffer is left alone
    cudaCheck(cudaFree(d_ranges));
    cudaCheck(cudaFree(d_offsets));
    cudaCheck(cudaFree(d_packed));
    free(packed);
}

// d12, 8 ranks, rank 3: what ZeRO-3 maps for the bf16 parameters, used by flat element index
static void test_zero3_parameters(size_t g) {
    GPT2Config d12 = gpt2_config_from_descriptor("d12");
    ZeroLayout z;
    zero_layout_init(&z, &d12, 8);
    const int rank = 3;
    ZeroRange byte_ranges[ZERO3_MAX_RESIDENT_RANGES];
    int count = zero3_resident_ranges(&z, rank, sizeof(uint16_t), g, byte_ranges, ZERO3_MAX_RESIDENT_RANGES);
    size_t free_before = 0, free_after = 0, total = 0;
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemGetInfo(&free_before, &total));
    SparseBuffer buf;
    sparse_buffer_create(&buf, z.padded_total * sizeof(uint16_t), byte_ranges, count, DEVICE, "d12 ZeRO-3 parameters");
    cudaCheck(cudaMemGetInfo(&free_after, &total));
    CHECK(buf.reserved_bytes == zero3_buffer_bytes(&z, sizeof(uint16_t), g) &&
          buf.mapped_bytes == zero3_resident_bytes(byte_ranges, count) && buf.num_maps == count,
          "d12 rank 3: reserved %zu, mapped %zu in %d maps; expected %zu, %zu in %d", buf.reserved_bytes, buf.mapped_bytes,
          buf.num_maps, zero3_buffer_bytes(&z, sizeof(uint16_t), g), zero3_resident_bytes(byte_ranges, count), count);
    size_t used = free_before - free_after;
    size_t unmapped = buf.reserved_bytes - buf.mapped_bytes;
    printf("d12 N=8 rank 3: %.1f MiB reserved, %.1f MiB mapped in %d ranges, device free memory down %.1f MiB\n",
           buf.reserved_bytes / 1048576.0, buf.mapped_bytes / 1048576.0, count, used / 1048576.0);
    CHECK(used >= buf.mapped_bytes && used < buf.mapped_bytes + unmapped / 2,
          "d12 rank 3: free memory went down %zu bytes for %zu mapped of %zu reserved", used, buf.mapped_bytes,
          buf.reserved_bytes);
    // the elements the rank uses: every non-matmul tensor, its own range
    ZeroRange elements[NUM_PARAMETER_TENSORS + 1];
    int num_elements = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (zero_tensor_is_matmul_weight(i)) { continue; }
        elements[num_elements].begin = z.tensor_offsets[i];
        elements[num_elements++].end = z.tensor_offsets[i] + z.tensor_sizes[i];
    }
    elements[num_elements++] = zero_rank_range(&z, rank);
    ZeroRange* d_elements = (ZeroRange*)device_copy(elements, (size_t)num_elements * sizeof(ZeroRange));
    const uint32_t seed = 0xb16u;
    fill_elements_kernel<<<dim3(256, num_elements), THREADS>>>((uint16_t*)buf.base, d_elements, seed);
    cudaCheck(cudaGetLastError());
    size_t wrong = 0, checked = 0;
    for (int k = 0; k < num_elements; k++) {
        size_t n = elements[k].end - elements[k].begin;
        uint16_t* host = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
        cudaCheck(cudaMemcpy(host, (uint16_t*)buf.base + elements[k].begin, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) { wrong += host[i] != (uint16_t)word_pattern(elements[k].begin + i, seed); }
        checked += n;
        free(host);
    }
    CHECK(wrong == 0, "d12 rank 3: %zu of %zu resident bf16 elements read back wrong", wrong, checked);
    sparse_buffer_free(&buf);
    cudaCheck(cudaFree(d_elements));
}

// freeing gives the memory back: after sparse_buffer_free the device's free memory is what it
// was before sparse_buffer_create (a mapping's memory is released only once both its handle is
// released and the range unmapped: a create that kept the handles would leak every range)
static void test_free_returns_memory(size_t g) {
    const ZeroRange ranges[2] = {{g, 3 * g}, {4 * g, 5 * g}};
    size_t free_before = 0, free_mapped = 0, free_after = 0, total = 0;
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemGetInfo(&free_before, &total));
    SparseBuffer buf;
    sparse_buffer_create(&buf, 6 * g, ranges, 2, DEVICE, "memory return test buffer");
    cudaCheck(cudaMemGetInfo(&free_mapped, &total));
    // a GPU's driver may take some memory of its own (page tables): at least the mapped bytes,
    // and less than one granule left behind, where a kept handle leaves a whole range's
    CHECK(free_before - free_mapped >= 3 * g, "memory return: create took %zu bytes, expected at least the %zu mapped",
          free_before - free_mapped, 3 * g);
    sparse_buffer_free(&buf);
    cudaCheck(cudaMemGetInfo(&free_after, &total));
    CHECK(free_after + g > free_before, "memory return: %zu bytes free after free, %zu before create (a leak of %zd)",
          free_after, free_before, (ssize_t)(free_before - free_after));
}

// ranges that touch end to start ({0, g}, {g, 2g}: zero3_resident_ranges may return such) are
// disjoint and must be accepted: the check refuses only a range that begins before the previous
// one ends. Runs in a child, which must exit 0.
static void test_adjacent_ranges_accepted(size_t g) {
    const ZeroRange adjacent[2] = {{0, g}, {g, 2 * g}};
    ChildRun run;
    if (child_run_begin(&run)) { sparse_buffer_check_ranges(4 * g, adjacent, 2, g, "test params"); _exit(0); }
    char text[CHILD_STDERR_MAX + 1];
    size_t length;
    int status = child_run_collect(&run, text, &length);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "adjacent ranges {0, g}, {g, 2g} refused: [%s]", text);
}

// the range checks' other edges: an empty range, an end off the granularity (the begin on it),
// a negative count (host-only)
static void test_more_bad_ranges(size_t g) {
    const ZeroRange empty[1] = {{g, g}};
    const ZeroRange end_unaligned[1] = {{0, g + g / 2}};
    CHECK_DIES("empty range", "non-empty", sparse_buffer_check_ranges(4 * g, empty, 1, g, "test params"));
    CHECK_DIES("range end off the granularity", "granularity",
               sparse_buffer_check_ranges(4 * g, end_unaligned, 1, g, "test params"));
    CHECK_DIES("negative range count", "mapped ranges", sparse_buffer_check_ranges(4 * g, NULL, -1, g, "test params"));
}

// children that call the driver (a CUDA process may not fork): main runs these before it touches CUDA.
// sparse_buffer_create checks its ranges itself, before any reservation or mapping: overlapping
// ranges die with the range check's line, not with the driver's refusal of the second cuMemMap.
// And a driver out-of-memory error carries the hint (the only advice sparse_buffer_check gives).
static void create_with_overlapping_ranges(void) {
    size_t g = sparse_buffer_granularity(DEVICE);
    const ZeroRange overlapping[2] = {{0, 2 * g}, {g, 3 * g}};
    SparseBuffer buf;
    sparse_buffer_create(&buf, 4 * g, overlapping, 2, DEVICE, "test params");
}

static void test_driver_children(void) {
    CHECK_DIES("create with overlapping ranges", "sorted, disjoint", create_with_overlapping_ranges());
    CHECK_DIES("out-of-memory hint", "out of GPU memory",
               sparse_buffer_check(CUDA_ERROR_OUT_OF_MEMORY, "test params", "cuMemCreate", "(test)"));
}

int main(void) {
    // before any CUDA call here: the child gets a clean process to fault in
    CHECK_DIES("kernel write to an unmapped granule", "cudaErrorIllegalAddress", run_unmapped_write());
    test_driver_children();
    cudaCheck(cudaSetDevice(DEVICE));
    size_t g = sparse_buffer_granularity(DEVICE);
    printf("allocation granularity (minimum) on device %d: %zu bytes\n", DEVICE, g);
    CHECK(g >= 4096 && (g & (g - 1)) == 0, "granularity %zu is not a power of two >= 4096", g);
    test_three_ranges(g);
    test_three_ranges(g);  // the addresses and memory went back: the same again
    test_zero3_parameters(g);
    cudaCheck(cudaDeviceSynchronize());
    const ZeroRange unaligned[1] = {{g / 2, g}};
    const ZeroRange overlapping[2] = {{0, 2 * g}, {g, 3 * g}};
    const ZeroRange outside[1] = {{g, 5 * g}};
    CHECK_DIES("unaligned range", "test params", sparse_buffer_check_ranges(4 * g, unaligned, 1, g, "test params"));
    CHECK_DIES("overlapping ranges", "sorted, disjoint", sparse_buffer_check_ranges(4 * g, overlapping, 2, g, "test params"));
    CHECK_DIES("range past the end", "inside the", sparse_buffer_check_ranges(4 * g, outside, 1, g, "test params"));
    CHECK_DIES("empty buffer", "0 bytes", sparse_buffer_create(NULL, 0, NULL, 0, DEVICE, "test params"));
    test_free_returns_memory(g);
    test_adjacent_ranges_accepted(g);
    test_more_bad_ranges(g);
    return test_summary("test_sparse_buffer");
}
