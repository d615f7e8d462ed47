/*
cudasim_driver.cpp: the CUDA driver's virtual memory management calls llm8's sparse device
buffers use (llmc/sparse_buffer.cuh), reached as llm8 reaches them: through the runtime's
cudaGetDriverEntryPointByVersion, never linked by name (the real build does not link libcuda).

Why: ZeRO-3 reserves the address range of the whole parameter vector and backs only the
rank's resident ranges with memory, so a kernel that strays outside them must fault, and the
rounding of the ranges to the allocation granularity must be the GPU's. Both are checked
here on host memory:
- cuMemAddressReserve is a PROT_NONE anonymous mapping (addresses, no memory);
- cuMemCreate makes the physical memory: a memfd filled with 0xff (new device memory holds
  garbage; 0xff is NaN in bf16 and fp32, as cudaMalloc's here), counted in cudaMemGetInfo;
- cuMemMap maps the memfd over the reservation still PROT_NONE (the documentation: mapping
  does not make the range accessible), cuMemSetAccess mprotects it, cuMemUnmap puts the
  PROT_NONE reservation back and cuMemRelease/cuMemUnmap free the memory once neither the
  handle nor a mapping holds it;
- the documented rules are enforced with the documented CUresult: sizes, offsets and
  addresses on the 2 MiB granularity (the minimum of an H100), mappings only inside a
  reservation and only where nothing is mapped, unmapping whole mappings only, access only
  on fully mapped ranges, flags and offset zero;
- a kernel touching a reserved address without accessible memory (PROT_NONE) ends its grid
  with the sticky cudaErrorIllegalAddress that the next synchronizing call returns, as a GPU
  reports a fault (cudasim_runtime.cpp's abandon_kernel); host code touching one dies with a
  line saying so (the GPU's host cannot touch device memory at all).
Where the documentation is silent: freeing a reservation that still has mappings is refused
(CUDA_ERROR_INVALID_VALUE: it would leak the mapped memory); cuMemMap's "offset + size must
be less than the size of the allocation" is read as "at most"; a zero alignment means the
granularity; both granularities (minimum, recommended) are 2 MiB. Only one device (0), device
memory (CU_MEM_LOCATION_TYPE_DEVICE) and no shareable handles are emulated.
*/
#include "cudasim.h"
#include <cuda.h>
#include <cudaTypedefs.h>
#include <sys/mman.h>
#include <signal.h>
#include <unistd.h>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>

namespace {

const size_t GRANULARITY = 2u << 20;
const unsigned DRIVER_VERSION = 13000;  // CUDA 13.0, the toolkit the headers come from
const int DEVICE_COUNT = 1;             // cudasim has one device

// physical memory from cuMemCreate: held by its handle until cuMemRelease and by each mapping
struct PhysicalMemory {
    int fd;
    size_t bytes;
    int holders;
};

struct Reservation {
    size_t bytes;
    std::map<uintptr_t, std::pair<size_t, PhysicalMemory*>> mappings;  // address -> bytes, memory
};

std::mutex driver_mutex;
std::map<uintptr_t, Reservation> reservations;  // by base address
std::set<PhysicalMemory*> live_handles;         // created and not yet released

size_t page_bytes() { return (size_t)sysconf(_SC_PAGESIZE); }
bool on_granularity(uintptr_t value) { return value % GRANULARITY == 0; }

// the reservation holding all of [address, address + bytes), or null
Reservation* reservation_of(uintptr_t address, size_t bytes) {
    auto after = reservations.upper_bound(address);
    if (after == reservations.begin()) { return nullptr; }
    auto found = std::prev(after);
    if (address + bytes > found->first + found->second.bytes) { return nullptr; }
    return &found->second;
}

// true when [address, address + bytes) is exactly a run of whole, adjacent mappings
bool whole_mappings(const Reservation& r, uintptr_t address, size_t bytes) {
    uintptr_t at = address, end = address + bytes;
    while (at < end) {
        auto mapping = r.mappings.find(at);
        if (mapping == r.mappings.end()) { return false; }
        at += mapping->second.first;
    }
    return at == end;
}

void drop_holder(PhysicalMemory* memory) {
    if (--memory->holders > 0) { return; }
    close(memory->fd);
    cudasim::device_memory_release(memory->bytes);
    delete memory;
}

CUresult check_prop(const CUmemAllocationProp* prop) {
    if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) { return CUDA_ERROR_INVALID_VALUE; }
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (prop->location.id < 0 || prop->location.id >= DEVICE_COUNT) { return CUDA_ERROR_INVALID_DEVICE; }
    return CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------------------
// a kernel's fault in a reservation

struct sigaction previous_segv_action;

// Reads `reservations` unlocked: a fault comes from the thread that runs kernels, which is not
// inside a driver call at that moment.
void on_segv(int, siginfo_t* info, void*) {
    uintptr_t address = (uintptr_t)info->si_addr;
    bool reserved = false;
    for (const auto& r : reservations) { reserved |= address >= r.first && address < r.first + r.second.bytes; }
    if (reserved && cudasim::kernel_running()) { cudasim::abandon_kernel(cudaErrorIllegalAddress); }
    if (reserved) {
        static const char text[] = "cudasim: host code touched a reserved device address without accessible memory\n";
        ssize_t ignored = write(STDERR_FILENO, text, sizeof(text) - 1);
        (void)ignored;
    }
    sigaction(SIGSEGV, &previous_segv_action, nullptr);  // returning repeats the access: it faults as without us
}

void install_fault_handler() {
    static bool installed = false;
    if (installed) { return; }
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;  // NODEFER: abandon_kernel jumps out without restoring a mask
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_segv_action);
    installed = true;
}

// ----------------------------------------------------------------------------------------
// the driver functions (static: the binary has no cuMem* symbols, as without libcuda)

CUresult get_error_name(CUresult error, const char** name) {
    switch (error) {
#define NAME(code) case code: *name = #code; return CUDA_SUCCESS;
        NAME(CUDA_SUCCESS)
        NAME(CUDA_ERROR_INVALID_VALUE)
        NAME(CUDA_ERROR_OUT_OF_MEMORY)
        NAME(CUDA_ERROR_NOT_INITIALIZED)
        NAME(CUDA_ERROR_DEINITIALIZED)
        NAME(CUDA_ERROR_INVALID_DEVICE)
        NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
        NAME(CUDA_ERROR_NOT_PERMITTED)
        NAME(CUDA_ERROR_NOT_SUPPORTED)
        NAME(CUDA_ERROR_ILLEGAL_STATE)
#undef NAME
        default: *name = nullptr; return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult get_allocation_granularity(size_t* granularity, const CUmemAllocationProp* prop,
                                    CUmemAllocationGranularity_flags option) {
    if (granularity == nullptr ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult valid = check_prop(prop);
    if (valid != CUDA_SUCCESS) { return valid; }
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
    size_t page = page_bytes();
    if (ptr == nullptr || flags != 0 || size == 0 || size % page != 0 || addr % page != 0 ||
        (alignment & (alignment - 1)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t align = std::max(alignment == 0 ? GRANULARITY : alignment, page);
    char* mapping = (char*)mmap((void*)addr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) { return CUDA_ERROR_OUT_OF_MEMORY; }
    char* base = (char*)(((uintptr_t)mapping + align - 1) & ~(uintptr_t)(align - 1));
    if (base > mapping) { munmap(mapping, base - mapping); }
    if (mapping + size + align > base + size) { munmap(base + size, mapping + size + align - (base + size)); }
    std::lock_guard<std::mutex> lock(driver_mutex);
    install_fault_handler();
    reservations[(uintptr_t)base] = Reservation{size, {}};
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

CUresult address_free(CUdeviceptr ptr, size_t size) {
    std::lock_guard<std::mutex> lock(driver_mutex);
    auto found = reservations.find((uintptr_t)ptr);
    if (found == reservations.end() || found->second.bytes != size || !found->second.mappings.empty()) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void*)ptr, size);
    reservations.erase(found);
    return CUDA_SUCCESS;
}

CUresult create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                unsigned long long flags) {
    if (handle == nullptr || flags != 0 || size == 0 || !on_granularity(size)) { return CUDA_ERROR_INVALID_VALUE; }
    CUresult valid = check_prop(prop);
    if (valid != CUDA_SUCCESS) { return valid; }
    if (!cudasim::device_memory_acquire(size)) { return CUDA_ERROR_OUT_OF_MEMORY; }
    int fd = memfd_create("cudasim-cuMemCreate", MFD_CLOEXEC);
    void* fill = fd >= 0 && ftruncate(fd, (off_t)size) == 0
                     ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fill == MAP_FAILED) {
        if (fd >= 0) { close(fd); }
        cudasim::device_memory_release(size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(fill, 0xff, size);
    munmap(fill, size);
    PhysicalMemory* memory = new PhysicalMemory{fd, size, 1};
    std::lock_guard<std::mutex> lock(driver_mutex);
    live_handles.insert(memory);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)memory;
    return CUDA_SUCCESS;
}

CUresult release(CUmemGenericAllocationHandle handle) {
    std::lock_guard<std::mutex> lock(driver_mutex);
    auto found = live_handles.find((PhysicalMemory*)(uintptr_t)handle);
    if (found == live_handles.end()) { return CUDA_ERROR_INVALID_VALUE; }
    PhysicalMemory* memory = *found;
    live_handles.erase(found);
    drop_holder(memory);
    return CUDA_SUCCESS;
}

CUresult map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) {
    std::lock_guard<std::mutex> lock(driver_mutex);
    auto found = live_handles.find((PhysicalMemory*)(uintptr_t)handle);
    if (flags != 0 || offset != 0 || found == live_handles.end() || size == 0 || !on_granularity(ptr) ||
        !on_granularity(size) || size > (*found)->bytes) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    Reservation* r = reservation_of(ptr, size);
    if (r == nullptr) { return CUDA_ERROR_INVALID_VALUE; }
    auto next = r->mappings.lower_bound(ptr);
    bool overlaps_next = next != r->mappings.end() && next->first < ptr + size;
    bool overlaps_previous = next != r->mappings.begin() && std::prev(next)->first + std::prev(next)->second.first > ptr;
    if (overlaps_next || overlaps_previous) { return CUDA_ERROR_INVALID_VALUE; }
    PhysicalMemory* memory = *found;
    if (mmap((void*)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, memory->fd, 0) == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memory->holders++;
    r->mappings[ptr] = {size, memory};
    return CUDA_SUCCESS;
}

CUresult unmap(CUdeviceptr ptr, size_t size) {
    std::lock_guard<std::mutex> lock(driver_mutex);
    Reservation* r = reservation_of(ptr, size);
    if (r == nullptr || size == 0 || !whole_mappings(*r, ptr, size)) { return CUDA_ERROR_INVALID_VALUE; }
    for (uintptr_t at = ptr; at < ptr + size;) {
        auto mapping = r->mappings.find(at);
        size_t bytes = mapping->second.first;
        // the addresses go back to being a reservation: no memory, no access
        mmap((void*)at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        drop_holder(mapping->second.second);
        r->mappings.erase(mapping);
        at += bytes;
    }
    return CUDA_SUCCESS;
}

CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
    if (desc == nullptr || count == 0) { return CUDA_ERROR_INVALID_VALUE; }
    int protection = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) { return CUDA_ERROR_NOT_SUPPORTED; }
        if (desc[i].location.id < 0 || desc[i].location.id >= DEVICE_COUNT) { return CUDA_ERROR_INVALID_DEVICE; }
        switch (desc[i].flags) {
            case CU_MEM_ACCESS_FLAGS_PROT_NONE: protection = PROT_NONE; break;
            case CU_MEM_ACCESS_FLAGS_PROT_READ: protection = PROT_READ; break;
            case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: protection = PROT_READ | PROT_WRITE; break;
            default: return CUDA_ERROR_INVALID_VALUE;
        }
    }
    std::lock_guard<std::mutex> lock(driver_mutex);
    Reservation* r = reservation_of(ptr, size);
    if (r == nullptr || size == 0 || !whole_mappings(*r, ptr, size)) { return CUDA_ERROR_INVALID_VALUE; }
    mprotect((void*)ptr, size, protection);
    return CUDA_SUCCESS;
}

// each function has the type of its cudaTypedefs.h pointer at the version it was introduced
static_assert(std::is_same<decltype(&get_error_name), PFN_cuGetErrorName_v6000>::value, "cuGetErrorName");
static_assert(std::is_same<decltype(&get_allocation_granularity), PFN_cuMemGetAllocationGranularity_v10020>::value, "");
static_assert(std::is_same<decltype(&address_reserve), PFN_cuMemAddressReserve_v10020>::value, "cuMemAddressReserve");
static_assert(std::is_same<decltype(&address_free), PFN_cuMemAddressFree_v10020>::value, "cuMemAddressFree");
static_assert(std::is_same<decltype(&create), PFN_cuMemCreate_v10020>::value, "cuMemCreate");
static_assert(std::is_same<decltype(&release), PFN_cuMemRelease_v10020>::value, "cuMemRelease");
static_assert(std::is_same<decltype(&map), PFN_cuMemMap_v10020>::value, "cuMemMap");
static_assert(std::is_same<decltype(&unmap), PFN_cuMemUnmap_v10020>::value, "cuMemUnmap");
static_assert(std::is_same<decltype(&set_access), PFN_cuMemSetAccess_v10020>::value, "cuMemSetAccess");

struct EntryPoint {
    const char* symbol;
    unsigned introduced;  // the CUDA version whose ABI the function has
    void* function;
};
const EntryPoint ENTRY_POINTS[] = {
    {"cuGetErrorName", 6000, (void*)&get_error_name},
    {"cuMemGetAllocationGranularity", 10020, (void*)&get_allocation_granularity},
    {"cuMemAddressReserve", 10020, (void*)&address_reserve},
    {"cuMemAddressFree", 10020, (void*)&address_free},
    {"cuMemCreate", 10020, (void*)&create},
    {"cuMemRelease", 10020, (void*)&release},
    {"cuMemMap", 10020, (void*)&map},
    {"cuMemUnmap", 10020, (void*)&unmap},
    {"cuMemSetAccess", 10020, (void*)&set_access},
};

} // namespace

extern "C" cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int cudaVersion,
                                                        unsigned long long flags,
                                                        cudaDriverEntryPointQueryResult* status) {
    if (symbol == nullptr || function == nullptr || cudaVersion > DRIVER_VERSION ||
        (flags != cudaEnableDefault && flags != cudaEnableLegacyStream && flags != cudaEnablePerThreadDefaultStream)) {
        return cudaErrorInvalidValue;
    }
    cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
    *function = nullptr;
    for (const EntryPoint& entry : ENTRY_POINTS) {
        if (strcmp(entry.symbol, symbol) != 0) { continue; }
        result = cudaVersion >= entry.introduced ? cudaDriverEntryPointSuccess : cudaDriverEntryPointVersionNotSufficent;
        if (result == cudaDriverEntryPointSuccess) { *function = entry.function; }
    }
    if (status != nullptr) { *status = result; }
    return cudaSuccess;
}
