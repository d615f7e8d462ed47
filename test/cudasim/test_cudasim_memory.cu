/*
test_cudasim_memory.cu: cudasim faults a misaligned vector access as a GPU does (run under
cudasim only). A GPU loads a uint2 with one 8-byte instruction that needs an 8-byte aligned
address; x86 does not, so without cudasim's check (checked_reinterpret_cast, cudasim.h) a
kernel handed a misaligned pointer would pass every CPU test and fault on its first GPU run.
- 8 bytes loaded as a uint2 from an aligned address: the values arrive;
- the same from 4 bytes further on: the grid ends with cudaErrorMisalignedAddress, which
  sticks (so this case comes last);
- a block's dynamic shared memory ends at an inaccessible page: the last byte is writable,
  the byte after it faults (in a forked child, before this process touches CUDA).
*/
#include "llmc/cuda_common.h"
#include "test/test_harness.h"
#include "test/test_harness_fork.h"

__global__ void load_pair_kernel(uint2* out, const uint32_t* in, int offset) {
    *out = *reinterpret_cast<const uint2*>(in + offset);
}

__global__ void write_shared_byte_kernel(int index) {
    extern __shared__ unsigned char bytes[];
    bytes[index] = 1;
}

// whether a child that writes byte `index` of 64 bytes of dynamic shared memory ends by SIGSEGV
static bool shared_write_faults(int index) {
    ChildRun run;
    if (child_run_begin(&run)) {
        write_shared_byte_kernel<<<1, 1, 64>>>(index);
        _exit(cudaDeviceSynchronize() == cudaSuccess ? 0 : 1);
    }
    close(run.stderr_pipe[0]);
    int status = 0;
    waitpid(run.pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

int main() {
    CHECK(!shared_write_faults(63), "writing the last byte of 64 bytes of dynamic shared memory faults");
    CHECK(shared_write_faults(64), "writing one byte past 64 bytes of dynamic shared memory does not fault");
    uint32_t host_in[4] = {11, 22, 33, 44};
    uint32_t* in;
    uint2* out;
    cudaCheck(cudaMalloc(&in, sizeof(host_in)));
    cudaCheck(cudaMalloc(&out, sizeof(uint2)));
    cudaCheck(cudaMemcpy(in, host_in, sizeof(host_in), cudaMemcpyHostToDevice));

    load_pair_kernel<<<1, 1>>>(out, in, 2);
    cudaCheck(cudaDeviceSynchronize());
    uint2 got;
    cudaCheck(cudaMemcpy(&got, out, sizeof(got), cudaMemcpyDeviceToHost));
    CHECK(got.x == 33 && got.y == 44, "aligned uint2 load: got (%u, %u), expected (33, 44)", got.x, got.y);

    load_pair_kernel<<<1, 1>>>(out, in, 1);
    cudaError_t error = cudaDeviceSynchronize();
    CHECK(error == cudaErrorMisalignedAddress, "uint2 load 4 bytes off alignment: %s, expected cudaErrorMisalignedAddress",
          cudaGetErrorName(error));
    return test_summary("test_cudasim_memory");
}
