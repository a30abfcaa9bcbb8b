"""Kernels the builtin engine builds from C at run time, with the machine's own compiler.

:func:`kernels` returns ``kernels.c`` loaded (:class:`Kernels`): the varlen decode attention (each
decoding sequence writes its new key and value and reads only its own columns of the slot cache, which
holds float32, float16 or bfloat16; torch's batched attention reads every row up to the longest and
masks the rest) and RMSNorm in one pass
(torch's CPU ``rms_norm`` runs about eight operations), rotary embedding turning the packed queries and
keys in place (torch's runs six operations and copies), the MLP's ``silu(gate) * up`` in one pass, and a
decode step's sampling (processed logprobs and the seeded draw: about ten operations and a Python hash
per row in torch). Or ``None``, with the reason logged once, where
they cannot be had: no C compiler, a failed build, or ``RFT_ENGINE_KERNELS=torch``.

An image builds the library ahead, once per x86-64 level (:func:`prebuild`: ``-march=x86-64-v4`` down to
``x86-64``) into ``$RFT_NATIVE_PREBUILT``, and the engine loads the highest level this CPU runs: no compiler
is invoked when a pod starts. Elsewhere (a development machine, or a source the prebuilt files do not
match) it is compiled once per source and machine (``-O3 -march=native``, OpenMP where the compiler has
it) into ``$RFT_NATIVE_CACHE``, else ``~/.cache/rft-operator/native``, else the temporary directory,
named by a hash of the source, the compiler's version, the flags and the CPU's model and flags, and
renamed into place when whole, so that concurrent servers never load a half-written file. A cache
directory another user owns or may write is never used. Nothing is downloaded.

With OpenMP, a large attention call splits its rows over ``torch.get_num_threads()`` threads: the library
links ``libgomp.so.1`` by its soname, which the dynamic loader resolves to the copy torch has already
loaded, so both share one thread pool.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from array import array
from pathlib import Path

import torch

from ..choices import pick

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.c")
ENV = "RFT_ENGINE_KERNELS"
CHOICES = ("auto", "native", "torch")
# Tried in order: the first that compiles is used.
FLAG_SETS = (("-march=native", "-fopenmp"), ("-fopenmp",), ("-march=native",), ())
# -fno-trapping-math: without it GCC vectorises no loop that calls the polynomial exp (its rounding and
# clamping could raise floating-point exceptions the scalar code would not), the softmax's included.
BASE_FLAGS = ("-O3", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast", "-fPIC",
              "-shared", "-std=gnu11")


PREBUILT_ENV = "RFT_NATIVE_PREBUILT"
# x86-64 levels, highest first, with the /proc/cpuinfo flags each needs beyond the one below it
LEVELS: tuple[tuple[str, set[str]], ...] = (
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe"}),
    ("x86-64-v2", {"cx16", "popcnt", "sse4_1", "sse4_2", "ssse3"}), ("x86-64", set()))

# the KV cache element types the decode attention reads (kernels.c's KV_F32, KV_F16, KV_BF16)
KV_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class NativeUnavailable(RuntimeError):
    """The kernels cannot be built or loaded here (the message says why)."""


def setting(value: str | None = None) -> str:
    """``value``, else ``$RFT_ENGINE_KERNELS``, else ``auto``; anything else is refused, naming it."""
    return pick(value, name="kernels", env=ENV, choices=CHOICES)


def _cpu_signature() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(sorted(set(lines)))


def _cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("RFT_NATIVE_CACHE"):
        dirs.append(Path(os.environ["RFT_NATIVE_CACHE"]))
    dirs.append(Path.home() / ".cache" / "rft-operator" / "native")
    dirs.append(Path(tempfile.gettempdir()) / f"rft-operator-native-{os.getuid()}")
    return [d for d in dirs if _own(d)]


def _own(d: Path) -> bool:
    """``d`` is absent, or ours and writable by no one else: a library another user could have planted
    there is never loaded."""
    try:
        st = d.stat()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _levels() -> list[str]:
    """The x86-64 levels this CPU runs, highest first (none off x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = set(" ".join(ln.split(":", 1)[1] for ln in _cpu_signature().splitlines() if ln.startswith("flags")).split())
    return [name for i, (name, _) in enumerate(LEVELS) if all(need <= flags for _, need in LEVELS[i:])]


def _prebuilt_name(code: bytes, level: str, parallel: bool) -> str:
    return f"kernels-{hashlib.sha256(code).hexdigest()[:16]}-{level}{'-omp' if parallel else ''}.so"


def prebuild(dest: Path, source: Path = SOURCE) -> list[Path]:
    """Compile ``source`` for every x86-64 level into ``dest`` (an image build step; OpenMP where it
    compiles); :func:`build` then loads the highest level the CPU runs."""
    cc, _ = _compiler()
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for level, _ in LEVELS:
        for extra in (("-fopenmp",), ()):
            path = dest / _prebuilt_name(source.read_bytes(), level, bool(extra))
            proc = subprocess.run([cc, *BASE_FLAGS, f"-march={level}", *extra, "-o", str(path), str(source), "-lm"],
                                  capture_output=True, text=True, timeout=300)
            if proc.returncode == 0:
                out.append(path)
                break
        else:
            raise NativeUnavailable(f"prebuild for {level} failed: {proc.stderr.strip()[-300:]}")
    return out


def _find_prebuilt(code: bytes) -> tuple[Path, bool] | None:
    d = os.environ.get(PREBUILT_ENV)
    found = [(Path(d) / _prebuilt_name(code, lv, par), par) for lv in _levels() for par in (True, False)] if d else []
    return next(((path, par) for path, par in found if path.is_file()), None)


def _compiler() -> tuple[str, str]:
    cc = os.environ.get("CC") or "cc"
    path = shutil.which(cc)
    if path is None:
        raise NativeUnavailable(f"no C compiler ({cc!r} is not on PATH)")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeUnavailable(f"{cc} --version failed: {exc}") from exc
    return path, version


def build(source: Path = SOURCE) -> tuple[Path, bool]:
    """Find ``source`` prebuilt for this CPU, or compile it (or find it compiled); return the library and
    whether it has OpenMP."""
    code = source.read_bytes()
    prebuilt = _find_prebuilt(code)
    if prebuilt is not None:
        return prebuilt
    cc, version = _compiler()
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([code, version.encode(), " ".join(BASE_FLAGS + flags).encode(),
                                         platform.machine().encode(), _cpu_signature().encode()])).hexdigest()[:20]
        name = f"{source.stem}-{key}.so"
        for d in _cache_dirs():
            if (d / name).is_file():
                return d / name, "-fopenmp" in flags
        for d in _cache_dirs():
            try:
                d.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.", suffix=".tmp")
                os.close(fd)
            except OSError:
                continue
            try:
                proc = subprocess.run([cc, *BASE_FLAGS, *flags, "-o", tmp, str(source), "-lm"],
                                      capture_output=True, text=True, timeout=120)
                if proc.returncode == 0:
                    os.chmod(tmp, 0o755)
                    os.replace(tmp, d / name)
                    return d / name, "-fopenmp" in flags
                errors.append(f"{' '.join(flags) or 'no extra flags'}: {proc.stderr.strip()[-300:]}")
            except (OSError, subprocess.SubprocessError) as exc:
                errors.append(f"{' '.join(flags) or 'no extra flags'}: {exc}")
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            break  # this directory is writable: another flag set, not another directory
        else:
            raise NativeUnavailable("no writable directory to build in: " + ", ".join(map(str, _cache_dirs())))
    raise NativeUnavailable("the C compiler failed: " + " | ".join(errors))


class Kernels:
    """``kernels.c`` loaded; call its functions with torch tensors."""

    def __init__(self, path: Path, parallel: bool):
        self.path, self.parallel = path, parallel
        lib = ctypes.CDLL(str(path))
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        attn = lib.rft_decode_attention
        attn.argtypes = [ptr, i64, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, i64, ptr, ptr, i64, i64, i64, i64, i64,
                         i64, ctypes.c_float, ctypes.c_int, i64, i64, ctypes.c_int]
        attn.restype = ctypes.c_int
        norm = lib.rft_rms_norm
        norm.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_float]
        norm.restype = None
        rope = lib.rft_rope
        rope.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, ptr, i64]
        rope.restype = ctypes.c_int
        silu_mul = lib.rft_silu_mul
        silu_mul.argtypes = [ptr, i64, ptr, i64, i64]
        silu_mul.restype = None
        sample = lib.rft_sample
        sample.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
        sample.restype = ctypes.c_int
        convert = lib.rft_kv_convert
        convert.argtypes = [ptr, ptr, ptr, i64, ctypes.c_int]
        convert.restype = ctypes.c_int
        self._attn, self._norm, self._rope, self._silu_mul, self._sample = attn, norm, rope, silu_mul, sample
        self._convert = convert

    def usable(self, device: torch.device, dtype: torch.dtype) -> bool:
        """float32 on the CPU, and either OpenMP or one intra-op thread (a single-threaded kernel must not
        replace torch's multi-threaded one)."""
        return device.type == "cpu" and dtype == torch.float32 and (self.parallel or torch.get_num_threads() == 1)

    def decode_attention(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, scale: float,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        """``q`` ``[rows, kv_heads, group, head_dim]`` (rows may be strided); ``k_new`` and ``v_new``
        ``[rows, kv_heads, head_dim]`` (strided rows and heads), written into column ``lengths - 1`` of
        each row's slot; the slot cache's ``keys`` and ``values`` ``[slots, kv_heads, capacity, head_dim]``
        (contiguous; float32, float16 or bfloat16: read as float32, the new keys and values rounded to it as
        torch's ``copy_`` rounds); int64 ``slots`` and ``lengths`` ``[rows]``. Returns the attention output
        ``[rows, kv_heads, group, head_dim]``, written into ``out`` (contiguous, that shape) when given:
        a buffer the caller reuses saves an allocation per call."""
        rows, kv_heads, group, hd = q.shape
        if q.stride(3) != 1 or q.stride(2) != hd or q.stride(1) != group * hd:
            q = q.contiguous()
        if k_new.stride(2) != 1:
            k_new = k_new.contiguous()
        if v_new.stride(2) != 1:
            v_new = v_new.contiguous()
        return self._attend(q.data_ptr(), q.stride(0), k_new.data_ptr(), k_new.stride(0), k_new.stride(1),
                            v_new.data_ptr(), v_new.stride(0), v_new.stride(1), rows, kv_heads, group, hd, keys,
                            values, slots, lengths, scale, out)

    def decode_attention_packed(self, qkv: torch.Tensor, rows: int, heads: int, keys: torch.Tensor,
                                values: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, scale: float,
                                out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`decode_attention` of the first ``rows`` tokens of the packed projections ``qkv`` ``[tokens,
        heads + 2 kv_heads, head_dim]`` (float32; tokens may be strided, each token's heads contiguous): the
        query heads, then the new key heads, then the new value heads, read where they lie (no view or copy
        of them is made)."""
        tokens, n, hd = qkv.shape
        kv_heads = (n - heads) // 2
        if qkv.dtype != torch.float32 or qkv.stride(2) != 1 or qkv.stride(1) != hd or rows > tokens \
                or kv_heads < 1 or n != heads + 2 * kv_heads or heads % kv_heads:
            raise ValueError(f"decode attention: qkv must be float32 [>= {rows}, {heads} + 2 kv_heads, head_dim] "
                             f"with contiguous heads, got {qkv.dtype} {tuple(qkv.shape)} strides {qkv.stride()}")
        base, row, size = qkv.data_ptr(), qkv.stride(0), qkv.element_size()
        return self._attend(base, row, base + heads * hd * size, row, hd, base + (heads + kv_heads) * hd * size, row,
                            hd, rows, kv_heads, heads // kv_heads, hd, keys, values, slots, lengths, scale, out)

    def _attend(self, q: int, q_row: int, k_new: int, kn_row: int, kn_head: int, v_new: int, vn_row: int,
                vn_head: int, rows: int, kv_heads: int, group: int, hd: int, keys: torch.Tensor,
                values: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, scale: float,
                out: torch.Tensor | None) -> torch.Tensor:
        # the kernel writes into the cache through raw pointers: refuse a layout it does not assume
        for name, t in (("keys", keys), ("values", values)):
            if t.dtype not in KV_KINDS or not t.is_contiguous() or t.shape[1] != kv_heads or t.shape[3] != hd:
                raise ValueError(f"decode attention: {name} must be a contiguous float32, float16 or bfloat16 cache "
                                 f"[slots, {kv_heads}, capacity, {hd}], got {t.dtype} {tuple(t.shape)}")
        if keys.shape != values.shape or keys.dtype != values.dtype:
            raise ValueError(f"decode attention: keys {keys.dtype} {tuple(keys.shape)} and values {values.dtype} "
                             f"{tuple(values.shape)} differ")
        for name, t in (("slots", slots), ("lengths", lengths)):
            if t.dtype != torch.int64 or not t.is_contiguous() or t.shape != (rows,):
                raise ValueError(f"decode attention: {name} must be contiguous int64 [{rows}], got {t.dtype} "
                                 f"{tuple(t.shape)}")
        shape = (rows, kv_heads, group, hd)
        if out is None:
            out = torch.empty(shape, dtype=torch.float32)
        elif out.shape != shape or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"decode attention: out must be contiguous float32 {shape}, got {tuple(out.shape)}")
        rc = self._attn(q, q_row, out.data_ptr(), keys.data_ptr(), values.data_ptr(), k_new, kn_row, kn_head, v_new,
                        vn_row, vn_head, slots.data_ptr(), lengths.data_ptr(), rows, kv_heads, group, hd,
                        keys.stride(0), keys.stride(1), scale, torch.get_num_threads(), keys.shape[0], keys.shape[2],
                        KV_KINDS[keys.dtype])
        if rc == -2:
            raise ValueError(f"decode attention: slots must lie in [0, {keys.shape[0]}) and lengths in [1, "
                             f"{keys.shape[2]}], got {slots.tolist()} and {lengths.tolist()}")
        if rc != 0:
            raise MemoryError("decode attention: could not allocate its scratch")
        return out

    def kv_convert(self, x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (float32) stored as the decode attention stores new keys and values in a cache of ``dtype``,
        and those read back as it reads them: ``(stored, back)``, for tests to compare with torch's
        conversions bit for bit."""
        if x.dtype != torch.float32 or dtype not in KV_KINDS:
            raise ValueError(f"kv_convert: float32 x and a cache dtype of {list(KV_KINDS)}, got {x.dtype}, {dtype}")
        x = x.contiguous()
        stored, back = torch.empty(x.shape, dtype=dtype), torch.empty_like(x)
        self._convert(x.data_ptr(), stored.data_ptr(), back.data_ptr(), x.numel(), KV_KINDS[dtype])
        return stored, back

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dimension of ``x`` (float32), as transformers' float32 RMSNorm computes it
        (to float rounding)."""
        if x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.shape != (x.shape[-1],):
            raise ValueError(f"rms_norm: float32 x [..., n] and weight [n], got {x.dtype} {tuple(x.shape)} and "
                             f"{weight.dtype} {tuple(weight.shape)}")
        if not x.is_contiguous():
            x = x.contiguous()
        weight = weight.contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        self._norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // n, n, eps)
        return out

    def rope(self, x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> None:
        """Rotary embedding in place on the first ``heads`` heads of every token of ``x`` ``[tokens, n, head_dim]``
        (float32; tokens may be strided, each token's heads contiguous), as transformers'
        ``apply_rotary_pos_emb`` computes it (to float rounding): ``cos`` and ``sin`` are tables
        ``[positions, head_dim]`` (contiguous float32), read at int64 ``positions`` ``[tokens]``."""
        tokens, n, hd = x.shape
        if x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != hd or heads > n or hd % 2:
            raise ValueError(f"rope: x must be float32 [tokens, heads, head_dim] with contiguous heads of an even "
                             f"size and at least {heads} heads, got {x.dtype} {tuple(x.shape)} strides {x.stride()}")
        for name, t in (("cos", cos), ("sin", sin)):
            if t.dtype != torch.float32 or not t.is_contiguous() or t.dim() != 2 or t.shape[1] != hd:
                raise ValueError(f"rope: {name} must be a contiguous float32 table [positions, {hd}], got {t.dtype} "
                                 f"{tuple(t.shape)}")
        if positions.dtype != torch.int64 or not positions.is_contiguous() or positions.shape != (tokens,):
            raise ValueError(f"rope: positions must be contiguous int64 [{tokens}], got {positions.dtype} "
                             f"{tuple(positions.shape)}")
        table = min(cos.shape[0], sin.shape[0])
        if self._rope(x.data_ptr(), tokens, x.stride(0), heads, hd, cos.data_ptr(), sin.data_ptr(),
                      positions.data_ptr(), table) != 0:
            raise ValueError(f"rope: positions must lie in the tables' [0, {table}), got {positions.tolist()}")

    def silu_mul(self, gate_up: torch.Tensor, inter: int) -> torch.Tensor:
        """``silu(gate) * up`` ``[rows, inter]`` (float32, new) of ``gate_up`` ``[rows, 2 * inter]`` (each row its
        gate, then its up projection; rows may be strided), as ``F.silu(gate) * up`` computes it (to float
        rounding)."""
        if gate_up.dim() != 2 or gate_up.dtype != torch.float32 or gate_up.shape[1] != 2 * inter \
                or gate_up.stride(1) != 1:
            raise ValueError(f"silu_mul: gate_up must be float32 [rows, {2 * inter}] with contiguous rows, got "
                             f"{gate_up.dtype} {tuple(gate_up.shape)}")
        out = torch.empty((gate_up.shape[0], inter), dtype=torch.float32)
        self._silu_mul(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), gate_up.shape[0], inter)
        return out

    def sample(self, logits: torch.Tensor, temperatures: list[float], greedy: list[bool], seeds: list[int],
               steps: list[int]) -> tuple[torch.Tensor, list[int], list[float]]:
        """One decode step's sampling without top-k or top-p filters: the processed logprobs ``[rows, vocab]``
        (``log_softmax(logits / temperature)``, float32), each row's token (the first largest for a greedy row,
        else the inverse-CDF draw at the uniform of its seed and step, see
        :func:`rft_runtime.serve.sampler.row_uniforms`) and its logprob; as
        :func:`~rft_runtime.serve.sampler.sample_step` computes them (to float rounding), in one call."""
        rows, vocab = logits.shape
        if logits.dtype != torch.float32 or logits.device.type != "cpu" or vocab < 1:
            raise ValueError(f"sample: float32 CPU logits [rows, vocab], got {logits.dtype} {tuple(logits.shape)} "
                             f"on {logits.device}")
        if not all(len(v) == rows for v in (temperatures, greedy, seeds, steps)):
            raise ValueError(f"sample: one temperature, greedy flag, seed and step per row ({rows})")
        logits = logits.contiguous()
        # the per-row inputs and outputs as Python arrays: a tenth of what a torch tensor costs to make
        temps, flags = array("f", temperatures), array("B", greedy)
        seeds_a, steps_a = array("q", seeds), array("q", steps)
        logprobs = torch.empty((rows, vocab), dtype=torch.float32)
        tokens, chosen = array("q", bytes(8 * rows)), array("f", bytes(4 * rows))
        if self._sample(logits.data_ptr(), rows, vocab, *(a.buffer_info()[0] for a in (temps, flags, seeds_a, steps_a)),
                        logprobs.data_ptr(), tokens.buffer_info()[0], chosen.buffer_info()[0]) != 0:
            raise MemoryError("sample: could not allocate its scratch")
        return logprobs, tokens.tolist(), chosen.tolist()


@functools.cache
def kernels(choice: str = "auto") -> Kernels | None:
    """The kernels, or None (``choice`` ``torch``, or ``auto`` where they cannot be built: logged once).
    ``native`` raises :class:`NativeUnavailable` instead of falling back."""
    if choice == "torch":
        return None
    try:
        path, parallel = build()
        kernel = Kernels(path, parallel)
    except (NativeUnavailable, OSError) as exc:
        if choice == "native":
            raise NativeUnavailable(f"{ENV}=native: {exc}") from exc
        log.warning("engine kernels: torch's (the native kernels are unavailable: %s)", exc)
        return None
    log.info("engine kernels: native %s (OpenMP: %s)", path.name, parallel)
    return kernel

