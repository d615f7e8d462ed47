"""
dev/nccl_sm90.py: the nvidia-nccl-cu13 wheel cut down to what runs on a Hopper GPU, so it fits
one device call.

Why: the device machine's NCCL (2.28) cannot put two ranks on one GPU, which issue 5's
multi-rank tests need (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL 2.30 or later), and it cannot
download. The wheel is 291 MiB, a call carries 64 MiB. Almost all of it is device code for
eight GPU architectures (sm_75 to sm_120) and debug information: libnccl.so.2's .nv_fatbin (the
linked kernels) and __nv_relfatbin (each file's relocatable kernels, which the CUDA runtime
registers too: 129 of the library's 205 registered fatbins point there) each hold one image
per architecture.

What it does, leaving every other byte of the library as it was:
- in each fatbin of those two sections it keeps the images a device of the target architecture
  (sm_90: H100, H200) can load, the cubins built for exactly that architecture and PTX of a
  virtual architecture at most it, and moves them up behind the fatbin's header, whose size it
  corrects; the bytes freed at the fatbin's end become zeros. A fatbin with no such image
  (20 of the linked ones are sm_100 alone) is left whole, so the runtime registers the same
  set of fatbins at the same addresses as before, and on the target finds in each the same
  image it picked before (a cubin of another architecture never loads on Hopper, and the
  wheel's PTX is compute_120's);
- the .debug_* sections (not loaded) become zeros;
- the wheel leaves out libnccl_device.bc and .ltoir (NCCL's device API for link-time
  optimization, which llm8 does not use), and its RECORD is rewritten to the new contents.
The zeros compress to almost nothing: the 2.32.3 wheel comes out at 35 MiB (sm_90 cubins 31.6 MiB).

Fatbin layout, as the files themselves show it (the library parses each one exactly and
stops with one line where anything else is found): a 16-byte header (magic 0xBA55ED50,
uint16 version, uint16 header size, uint64 size of the entries after it), then entries, each a
header (uint16 kind: 1 PTX, 2 cubin; uint16 version; uint32 header size; uint64 payload size;
the uint32 architecture at byte 28) and its payload; fatbins start 8-byte aligned, with zero
padding between them.

    python3 dev/nccl_sm90.py IN.whl OUT_DIR [--arch 90]

writes OUT_DIR/<the same file name> and prints what it kept.
"""
import argparse
import base64
import hashlib
import io
import os
import struct
import sys
import zipfile

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_PTX, KIND_CUBIN = 1, 2
LEFT_OUT = ("nvidia/nccl/lib/libnccl_device.bc", "nvidia/nccl/lib/libnccl_device.ltoir")
SHF_ALLOC = 0x2


class PruneError(Exception):
    pass


def elf_sections(image):
    """{name: (file offset, size, flags)} of an ELF64 little-endian file"""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise PruneError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    sections = {}
    for name_index, _type, flags, _addr, offset, size, *_ in headers:
        end = image.index(b"\0", names_offset + name_index)
        sections[image[names_offset + name_index:end].decode()] = (offset, size, flags)
    return sections


def runs_on(kind, arch, target):
    """whether a device of architecture `target` can load this image"""
    if kind == KIND_CUBIN:
        return arch == target
    if kind == KIND_PTX:
        return arch <= target
    return True  # an unknown kind: kept, the loader decides


def fatbin_entries(image, start, limit):
    """(header size, [(offset, length, kind, arch)], end) of the fatbin at `start`"""
    magic, _version, header_size, entries_size = struct.unpack_from("<IHHQ", image, start)
    if magic != FATBIN_MAGIC:
        raise PruneError(f"no fatbin header at offset {start:#x}")
    end = start + header_size + entries_size
    if end > limit:
        raise PruneError(f"the fatbin at offset {start:#x} runs past its section")
    entries, at = [], start + header_size
    while at < end:
        kind, _version, entry_header, payload = struct.unpack_from("<HHIQ", image, at)
        arch, = struct.unpack_from("<I", image, at + 28)
        length = entry_header + payload
        if entry_header < 32 or at + length > end or length % 8 != 0:
            raise PruneError(f"a malformed fatbin entry at offset {at:#x}")
        entries.append((at, length, kind, arch))
        at += length
    return header_size, entries, end


def prune_section(image, offset, size, target, kept):
    """rewrites every fatbin of image[offset:offset+size] in place; kept[(kind, arch)] counts bytes"""
    at, limit = offset, offset + size
    while at < limit:
        if image[at:at + 8] == bytes(8):  # padding between fatbins
            at += 8
            continue
        header_size, entries, end = fatbin_entries(image, at, limit)
        runnable = [e for e in entries if runs_on(e[2], e[3], target)]
        if runnable and len(runnable) < len(entries):
            body = b"".join(bytes(image[o:o + n]) for o, n, _, _ in runnable)
            struct.pack_into("<Q", image, at + 8, len(body))
            image[at + header_size:at + header_size + len(body)] = body
            image[at + header_size + len(body):end] = bytes(end - at - header_size - len(body))
        for _, length, kind, arch in (runnable or entries):
            kept[(kind, arch)] = kept.get((kind, arch), 0) + length
        at = (end + 7) & ~7


def prune_library(data, target):
    """the library's bytes with only `target`'s images in its fatbins and its debug sections zeroed"""
    try:
        return prune_image(bytearray(data), target)
    except (struct.error, ValueError) as e:  # a table or header pointing past the file's end
        raise PruneError(f"a truncated or malformed ELF file ({e})")


def prune_image(image, target):
    sections = elf_sections(image)
    if not any(name in sections for name in FATBIN_SECTIONS):
        raise PruneError(f"no {' or '.join(FATBIN_SECTIONS)} section")
    kept = {}
    for name in FATBIN_SECTIONS:
        if name in sections:
            offset, size, _ = sections[name]
            prune_section(image, offset, size, target, kept)
    for name, (offset, size, flags) in sections.items():
        if name.startswith(".debug_") and not flags & SHF_ALLOC:
            image[offset:offset + size] = bytes(size)
    if not any(kind == KIND_CUBIN and arch == target for kind, arch in kept):
        raise PruneError(f"no sm_{target} cubin in it")
    return bytes(image), kept


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def prune_wheel(source, out_dir, target):
    """writes the pruned wheel into out_dir; returns its path and {(kind, arch): bytes kept}"""
    with zipfile.ZipFile(source) as wheel:
        infos = {info.filename: info for info in wheel.infolist() if not info.is_dir()}
        members = {path: wheel.read(info) for path, info in infos.items()}
    libraries = [p for p in members if os.path.basename(p).startswith("libnccl.so")]
    if not libraries:
        raise PruneError("no libnccl.so in it")
    kept = {}
    for path in libraries:
        members[path], kept_here = prune_library(members[path], target)
        for key, n in kept_here.items():
            kept[key] = kept.get(key, 0) + n
    for path in LEFT_OUT:
        members.pop(path, None)
    records = [p for p in members if p.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise PruneError("no single .dist-info/RECORD in it")
    lines = [record_line(p, d) for p, d in members.items() if p != records[0]]
    members[records[0]] = ("\n".join(lines + [f"{records[0]},,"]) + "\n").encode()
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, os.path.basename(source))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as wheel:
        for path, data in members.items():  # each under its own entry: date and permissions kept
            wheel.writestr(infos[path], data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    with open(out, "wb") as f:  # written whole, after everything above succeeded
        f.write(buffer.getvalue())
    return out, kept


def main():
    parser = argparse.ArgumentParser(description="cut the nvidia-nccl-cu13 wheel down to one GPU architecture")
    parser.add_argument("wheel")
    parser.add_argument("out_dir")
    parser.add_argument("--arch", type=int, default=90, help="the GPU architecture kept (default 90: H100, H200)")
    args = parser.parse_args()
    try:
        out, kept = prune_wheel(args.wheel, args.out_dir, args.arch)
    except (PruneError, OSError, zipfile.BadZipFile) as e:
        sys.exit(f"error: dev/nccl_sm90.py: {args.wheel}: {e}")
    names = {KIND_PTX: "compute", KIND_CUBIN: "sm"}
    images = ", ".join(f"{names.get(kind, f'kind {kind} ')}_{arch} {n / 2**20:.1f} MiB"
                       for (kind, arch), n in sorted(kept.items()))
    print(f"{out}: {os.path.getsize(out) / 2**20:.1f} MiB; device code kept: {images}")


if __name__ == "__main__":
    main()
