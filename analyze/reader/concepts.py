"""Failure concepts: the layer behind the pattern table, for failures told in words the table does not know.

The pattern table (analyze/reader/patterns.py) knows llama.cpp's own wordings letter by letter. Reports also tell
a failure in a wrapper's words: return codes named as enums (`NoKvSlot`, `NoKvCacheSlot`, `DecodeError(1)`),
exception classes (.NET `LLamaDecodeError`, Python `RuntimeError: ...`), Go panics, a runner's `signal:
illegal instruction`, prose such as `Decode Error 1` or `device lost`. Each concept below is one failure
family with the stems it is named by, written so that any naming style matches: CamelCase and snake_case
and words with spaces (a separator is `[\\s_-]?`) and any case. The walker asks this layer only about lines
no table entry read (or only the generic one did), so the hot path never pays for it; a line it recognises
becomes a failure of the concept's kind at a lower confidence (its variant starts with `CONCEPT_PREFIX`,
and the verdict only takes such failures where the table found none).

`examples` are the lines a concept is for and `not_examples` lines that name its words without reporting a
failure (prose about decoding, a UnicodeDecodeError): tests/analyze/reader/test_concepts.py holds both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from kvtrace.analyze.reader.normalize import parse_prefix
from kvtrace.analyze.reader.spec import DRAFTER_NAMES

CONCEPT_PREFIX = "concept_"  # a failure's variant for a line this layer recognised
_S = r"[\s_-]?"  # the separator between two words in any naming style: `no kv slot`, `no_kv_slot`, `NoKvSlot`
_B = r"(?:^|[^a-z])"  # a word starts here (no look-behind: the table's rule, so RE2/Rust engines run them too)
_E = r"(?:$|[^a-z])"  # and ends here
# the rest of a word after its stem (`exceeds`, `llama_decode_internal`): bounded, as a search tries every stem of
# a stranger's line and an unbounded `\w*` runs from each to the end of a long word (a pasted run of the stem)
_TAIL = r"\w{0,16}"
# a return code after the name: `DecodeError(1)`, `Decode Error 1`, `NoKvSlot = 1`, `code -1`, `ret=1`
def _code(n: int) -> str:
    return (r"(?:(?:\W{0,3}(?:code|ret|rc|returned|result|status|with|error)){0,2}\W{0,3}?"
            rf"(?P<ret{n}>-?\d{{1,3}})(?:$|[\s),;'\"\]]))?")


_DRAFT_WORDS = re.compile("|".join((*DRAFTER_NAMES, "speculative")), re.IGNORECASE)


@dataclass(slots=True, frozen=True)
class Concept:
    name: str
    kind: str  # the failure kind it gives (records.SEVERITY's): decode_failed, kv_slot, assert, error, load
    regex: re.Pattern[str]
    examples: tuple[str, ...] = ()
    not_examples: tuple[str, ...] = ()

    @property
    def variant(self) -> str:
        return CONCEPT_PREFIX + self.name


def _c(name: str, kind: str, *alternatives: str, examples: tuple[str, ...] = (),
       not_examples: tuple[str, ...] = ()) -> Concept:
    return Concept(name, kind, re.compile(_alternation(alternatives), re.IGNORECASE), examples, not_examples)


_SHARED = (_B, "^")  # the openings `_alternation` shares


def _alternation(alternatives: tuple[str, ...]) -> str:
    """The alternatives as one regex, those that open with `_B` (or `^`) behind one `_B` (`^`), where the first
    of them stood. A search tries every alternative at every character of a line, and case-folded words give it
    no quick test to skip one by: a 1 MB line costs the alternatives entered at each character, and this shares
    the common openings (the rest of such an alternative holds no top-level `|`, which would leave it behind)."""
    out: list[str] = []
    for a in alternatives:
        opening = next((o for o in _SHARED if a.startswith(o)), "")
        group = [b.removeprefix(opening) for b in alternatives if opening and b.startswith(opening)]
        if len(group) < 2:
            out.append(f"(?:{a})")
        elif a.removeprefix(opening) == group[0]:
            out.append(opening + "(?:" + "|".join(f"(?:{w})" for w in group) + ")")
    return "|".join(out)


# Tried in order; the first that matches names the line. Position and KV-room come before the general
# decode failure: a wrapper's `DecodeError: no KV slot` is the KV room's.
CONCEPTS: tuple[Concept, ...] = (
    _c("position_check", "decode_failed",
       rf"{_B}inconsistent{_S}(?:sequence{_S})?positions?",
       rf"{_B}positions?{_S}(?:mismatch|not{_S}(?:consecutive|continuous)|inconsistent)",
       rf"{_B}invalid{_S}(?:sequence{_S})?positions?{_E}",
       examples=("LLamaSharp.Exceptions.LLamaDecodeError: InconsistentPositions",
                 "error: decode: position mismatch for seq 0",
                 "ValueError: positions not consecutive in batch"),
       not_examples=("The position of the cursor is inconsistently rendered in the UI",)),
    _c("no_kv_slot", "kv_slot",
       rf"{_B}no{_S}(?:free{_S})?kv{_S}(?:cache{_S})?slots?",
       rf"{_B}(?:kv{_S}cache|kv|context(?:{_S}window)?){_S}(?:is{_S})?full{_E}",
       rf"{_B}context{_S}(?:size{_S}|window{_S}|length{_S})?(?:exceeded|overflow)",
       rf"exceed{_TAIL}\s+(?:the\s+)?(?:maximum\s+|available\s+|model'?s?\s+)?context",
       # the context named by its variable, as llama.cpp's options and lines call it: `Prompt exceeds n_ctx: 2913
       # > 1024` (a wrapper's check), `the prompt (167416 tokens) exceeds n_ctx_slot = 131072`
       rf"{_B}exceed{_TAIL}\s+(?:the\s+)?n{_S}ctx(?:{_S}(?:slot|seq))?{_E}",
       rf"{_B}(?:find|found|get){_S}(?:a{_S})?(?:free{_S})?(?:kv|memory){_S}(?:cache{_S})?slot",
       # the prompt that does not fit told as a comparison, as runtimes word their check before any decode (LM
       # Studio: `The number of tokens to keep from the initial prompt is greater than the context length (n_keep:
       # 13055>= n_ctx: 4096)`, `the model is loaded with context length of only 32768 tokens, which is not enough`)
       r"(?:greater|larger|longer|bigger)\s+than\s+(?:the\s+)?(?:model'?s?\s+|max(?:imum)?\s+|available\s+|allowed\s+)?"
       rf"(?:context|n{_S}ctx){_E}",
       rf"{_B}n{_S}keep\W{{0,3}}\d+\s*>=?\s*n{_S}ctx",
       rf"{_B}(?:context{_S}(?:length|size|window)|n{_S}ctx){_E}[^.]{{0,40}}{_B}not{_S}enough{_E}",
       examples=("LLamaSharp.Exceptions.LLamaDecodeError: NoKvSlot",
                 "LLama.Exceptions.LLamaDecodeError: llama_decode failed: 'NoKvSlot'",
                 "DecodeResult.NoKvCacheSlot",
                 "Error: llama_decode returned NO_KV_SLOT",
                 "ValueError: Requested tokens (5000) exceed context window of 4096",
                 'I get this error: "Prompt exceeds n_ctx: 2913 > 1024"',
                 "error: the prompt (167416 tokens) exceeds n_ctx_slot = 131072",
                 "error: context full, cannot continue",
                 "panic: could not find a free kv slot",
                 "Error: KvCacheFull",
                 "[ERROR] The number of tokens to keep from the initial prompt is greater than the context length. "
                 "Try to load the model with a larger context length, or provide a shorter input.",
                 'API Error: 400 {"error":"The number of tokens to keep from the initial prompt is greater than the '
                 'context length (n_keep: 13055>= n_ctx: 4096)."}',
                 "Trying to keep the first 111490 tokens when context the overflows. However, the model is loaded "
                 "with context length of only 32768 tokens, which is not enough.",
                 "error: input (5120 tokens) is larger than the maximum context size",
                 "n_keep = 4200 >= n_ctx = 4096",
                 "ValueError: n_ctx is not enough for this prompt"),
       not_examples=("The kv cache slot layout is described in the docs",
                     "the context was full of useful examples", "raise n_ctx if the prompt exceeds it",
                     "a context larger than 8192 needs more memory", "the prompt is shorter than the context length",
                     "the context you gave is not enough to reproduce it",
                     "load it with a larger context length, which is enough for most prompts")),
    _c("compute_failed", "decode_failed",
       rf"{_B}failed{_S}to{_S}compute{_S}(?:the{_S})?graph",
       rf"{_B}graph{_S}compute{_TAIL}\s+failed",
       rf"{_B}compute{_S}(?:error|failed|failure)",
       examples=("process_ubatch: failed to compute graph, compute status: -1",
                 "ggml_backend_sched_graph_compute_async failed with error -1",
                 "LLamaDecodeError: ComputeFailed"),
       not_examples=("compute buffer size = 1.64 MiB, computed in 3 ms",)),
    _c("decode_failed", "decode_failed",
       rf"{_B}(?:llama{_S})?(?:decode|eval){_S}(?:has{_S}|was{_S})?(?:error|failed|failure|exception){_code(1)}",
       rf"{_B}llama{_S}decode{_TAIL}\s*(?:\(\))?\s*(?:failed|returned|error){_code(2)}",
       rf"{_B}llama{_S}decode{_TAIL}\W{{1,3}}(?:ret|rc|result|status)\s*[=:]\s*(?P<ret4>-?\d{{1,3}})",
       rf"{_B}failed{_S}to{_S}(?:llama{_S})?(?:decode|eval){_code(3)}",
       rf"{_B}(?:decode|eval){_S}(?:call{_S})?(?:returned|result){_S}(?:non{_S}zero|error|-?\d{{1,3}}{_E})",
       # llama_decode's return told by its variable alone, in prose or a wrapper's debug line: `That returned ret
       # == 1.`, `ret = -1` (llama.cpp's own lines name it `ret` too); 0 is a decode that worked
       rf"{_B}(?:returned\s+)?ret\s*==?\s*(?P<ret5>-?[1-9]\d{{0,2}})(?:$|[\s),;:'\"\]]|\.(?!\d))",
       examples=("LLama.Exceptions.LLamaDecodeError: llama_decode failed: 'Error'",
                 "Decode Error 1",
                 "DecodeError(-1)",
                 "RuntimeError: llama_decode failed with code -1",
                 "decode_failed: ret = -3",
                 "Error: failed to decode prompt",
                 "llama_decode: ret = -3",
                 "Error: Eval has failed",
                 "That returned ret == 1.",
                 "[DEBUGGING]: test ret == -3 512 and 1"),
       not_examples=("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0",
                     "coherent output, no `decode failed -1` / abort",
                     "it ran for an hour without decode failed errors",
                     "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
                     "speculative decoding makes decode about twice as fast",
                     "prompt eval time =     150.06 ms /    24 tokens",
                     "[DEBUGGING]: test ret == 0 512 and 1", "ret = 10.5 ms on average")),
    _c("assert", "assert",
       r"GGML_ASSERT",
       rf"{_B}assert(?:ion)?{_S}(?:failed|failure|error)",
       r"GGML_ABORT|ggml_abort",
       r"^\W*(?-i:Aborted|Abort trap)(?:\W|$)",
       # (MSVC's `Assertion failed: cond, file f, line n` and libstdc++'s `terminate called after throwing` are the
       # table's, patterns.py `msvc_assert` and `terminate`: an alternative here would never be asked)
       examples=("assertion failure in llama_batch_allocr::init",
                 "AssertionError: draft model returned no tokens",
                 "Abort trap: 6"),
       not_examples=("I aborted the request after a minute", "the assert is there for a reason")),
    _c("exception", "assert",
       rf"{_B}(?:unhandled|uncaught){_S}(?:exception|error|promise{_S}rejection|rejection)",
       r"^\s+at (?:async )?[\w$<>`\[\]]+(?:\.[\w$<>`\[\]]+)+\s?\(",
       examples=("Unhandled exception. System.Exception: boom",
                 "   at LLama.StatelessExecutor.<InferAsync>d__9.MoveNext()",
                 "    at LlamaContext.evaluate (file:///app/node_modules/node-llama-cpp/dist/index.js:10:5)",
                 "UnhandledPromiseRejection: This error originated either by throwing inside of an async function"),
       not_examples=("  at least that is what I saw (twice)", "I looked at e.g. (the docs)")),
    _c("crash_signal", "assert",
       rf"{_B}SIG(?:SEGV|ABRT|ILL|BUS|FPE){_E}",
       rf"{_B}seg(?:mentation)?{_S}fault",
       # (the wordings start a word, as `_B` says: behind one `_B`, a search enters them only where a word starts)
       rf"{_B}(?:illegal (?:instruction|memory access)|access violation|core dumped)",
       rf"{_B}exit (?:status|code) (?:(?:0x)?c0000\w{{3}}|-10737\d{{5}})",
       rf"{_B}(?:runner )?process (?:has )?(?:terminated|exited|crashed)(?: unexpectedly)?[:,] (?:signal|exit status)",
       # a runtime's runner that died, with or without its reason after it (ollama: `: exit status 2`,
       # `: GGML_ASSERT(...)`, or nothing, 2023's journald lines)
       rf"{_B}(?:runner|llama[ -]server|server) process (?:has )?(?:terminated|exited|crashed)",
       rf"{_B}error (?:starting|loading) (?:the )?llama (?:runner|server)",
       # a runner's exit, or cgo's (Go) in a crash dump
       rf"{_B}signal(?:: (?:killed|aborted|segmentation fault|illegal instruction)"
       r"| arrived during (?:cgo|external code) execution)",
       rf"{_B}(?:(?:model|server|runner|process|engine) has crashed|process no longer running)",
       # a crash told in the report's words with when or how it happened (`llama-server crashes during
       # prompt-eval`, `randomly crashes during inference with error`, `crashes with a pool overflow assertion`,
       # `crashed after sending an image`): the verb with its circumstance, not the noun (`fixes a crash when`)
       rf"{_B}crash(?:es|ed)\s+(?:[a-z]+ly\s+)?(?:during|with|after|when|while|on|at)\s",
       r"^\W*panic: ", rf"{_B}nil pointer dereference", r"^thread '[^']*' panicked at ",  # Go's and Rust's panics
       # a Go runtime's crash dump without its panic line: goroutine headers, `created by ... in goroutine N`,
       # cgo's `signal arrived during cgo execution`, and the register dump after it (`rax    0x0`, `rip 0x...`)
       r"^\s*goroutine \d+ (?:gp=\S+ m=\S+ (?:mp=\S+ )?)?\[[^\]]+\]:", r"^\s*created by \S+ in goroutine \d+",
       r"^\s*(?:rax|rip|eax|eip)\s+0x[0-9a-f]+\s*$",
       # a Go frame's location with the frame and stack pointers, which Go prints only in a crash's traceback
       # (`runtime/asm_amd64.s:1700 +0x1 fp=0xc00008f7e8 sp=... pc=...`, `net/fd_posix.go:55 +0x25 fp=...`)
       r"\.(?:go|s):\d+ \+0x[0-9a-f]+ fp=0x[0-9a-f]+ sp=0x[0-9a-f]+ pc=0x[0-9a-f]+",
       # gdb detaching after the backtrace ggml_print_backtrace asked it for: only a crash runs it
       r"^\W*\[Inferior \d+ \(process \d+\) detached\]",
       # a wrapper saying the process it ran exited with an error code (Node's child_process wording; ollama's
       # `exit status 2` and LM Studio's `(Exit code: N)` are above)
       rf"{_B}process exited with (?:exit )?code:? -?[1-9]\d*",
       r"^\W*(?-i:Killed|Bus error|Floating point exception)(?:\W|$)",
       examples=("Error: llama runner process has terminated: signal: illegal instruction (core dumped)",
                 "Thread 1 received signal SIGSEGV, Segmentation fault.",
                 "Error: llama runner process has terminated: exit status 0xc0000409",
                 "zsh: segmentation fault  ./llama-server -m model.gguf",
                 "panic: runtime error: invalid memory address or nil pointer dereference",
                 "Killed",
                 "thread 'main' panicked at src/main.rs:42:5:",
                 "goroutine 1 [running]:",
                 "goroutine 16 gp=0xc0001036c0 m=nil [IO wait]:",
                 "created by net/http.(*connReader).startBackgroundRead in goroutine 48",
                 "signal arrived during cgo execution",
                 "rax    0x0",
                 "        runtime/asm_amd64.s:1700 +0x1 fp=0xc00008f7e8 sp=0xc00008f7e0 pc=0x56be7cad5561",
                 "        net/fd_posix.go:55 +0x25 fp=0xc00029faa8 sp=0xc00029fa60 pc=0x64c824a077a5",
                 "[Inferior 1 (process 894291) detached]",
                 "Process exited with code 1",
                 "The model has crashed without additional information. (Exit code: 18446744072635812000)",
                 "Error: llama runner process no longer running: -1 ",
                 "2023/12/24 23:48:35 llama.go:459: error starting llama runner: llama runner process has terminated",
                 "Error: llama runner process has terminated. when running dolphin-mixtral",
                 'level=ERROR source=sched.go:455 msg="error loading llama server" error="llama runner process has '
                 'terminated: exit status 2"',
                 "llama-server process has terminated: llama_init_from_model: failed to initialize the context",
                 "From time to time llama-server crashes during prompt-eval.",
                 "Works but randomly crashes during inference with error",
                 "llama-server crashes with a pool overflow assertion after processing several requests"),
       not_examples=("no crash so far, the signal handler is installed", "I killed the server and restarted it",
                     "it ran all night without a segmentation fault",
                     "each request runs in its own goroutine", "rax holds the return value",
                     "        main.go:12 +0x1d", "Process exited with code 0",
                     "This PR fixes a crash when using tree-based speculative decoding",
                     "it never crashed during the whole benchmark", "with -np 1 it never crashes with MTP on")),
    _c("device_lost", "assert",
       rf"{_B}(?:vk{_S}|error{_S})?device{_S}(?:lost|removed|hung|hang|reset){_E}",
       r"VK_ERROR_DEVICE_LOST|DXGI_ERROR_DEVICE_(?:REMOVED|HUNG|RESET)",
       r"GPU (?:hang|fault|has fallen off the bus)|fallen off the bus",
       # a GPU driver's dump of a hung batch: Mesa's Intel drivers list the batch and its buffer objects
       r"^\s*Batch offset=0x[0-9a-f]+ len=0x[0-9a-f]+ on queue \d+",
       r"^\s*BO: addr=0x[0-9a-f]+-0x[0-9a-f]+ size=",
       examples=("ggml_vulkan: vk::Queue::submit: ErrorDeviceLost",
                 "VK_ERROR_DEVICE_LOST",
                 "Error: device lost",
                 "NVRM: Xid 79, GPU has fallen off the bus.",
                 "Batch offset=0x0 len=0x0 on queue 0 (aperture: 373.2Mb, 0.0Mb VRAM only)",
                 "   BO: addr=0xffffeffeffffe000-0xffffeffeffffffff size=      8KB handle=00008 capture=1"),
       not_examples=("Is there a device list option?",)),
    _c("out_of_memory", "error",
       rf"out{_S}of{_S}(?:device{_S}|gpu{_S}|video{_S}|host{_S}|system{_S})?memory",  # inside CamelCase names too
       rf"{_B}(?:not{_S}enough|insufficient){_S}(?:free{_S})?(?:device{_S}|gpu{_S}|video{_S}|system{_S})?memory",
       rf"{_B}requires{_S}more{_S}(?:system{_S}|gpu{_S}|video{_S})?memory",
       r"cudaMalloc failed|cudaErrorMemoryAllocation|hipErrorOutOfMemory|ErrorOutOfDeviceMemory",
       rf"{_B}failed{_S}to{_S}allocate{_TAIL}\s+(?:[\w.]+\s+)?(?:buffer|memory|\d+(?:\.\d+)?\s*MiB)",
       rf"{_B}OOM(?:{_S}killed|{_S}error)?{_E}",
       examples=("CUDA error: out of memory",
                 "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc failed: "
                 "out of memory",
                 "ggml_vulkan: Device memory allocation of size 1073741824 failed. ErrorOutOfDeviceMemory",
                 "llama_kv_cache: failed to allocate buffer for kv cache",
                 "OutOfMemoryError",
                 "error: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
                 "Error: model requires more system memory (12.4 GiB) than is available (7.9 GiB)"),
       not_examples=("it uses about 5 GB of memory",)),
    # a GPU backend's own error line (CUDA's is the table's `cuda_error`): the backend aborts after it
    _c("backend_error", "assert",
       r"(?:^|[^A-Za-z])(?:HIP|ROCm|SYCL|MUSA|CANN|Metal|Vulkan|OpenCL) error\b",
       r"hipError\w+|VK_ERROR_\w+|UR_RESULT_ERROR_\w+",
       examples=("ROCm error: invalid device function",
                 "SYCL error: CHECK_TRY_ERROR((*stream).memcpy(...).wait()): Exception caught in this line of code.",
                 "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"),
       not_examples=("built with the ROCm backend, no error so far",)),
    _c("load_failed", "load",
       rf"{_B}(?:failed|unable|could{_S}not|cannot|can't|couldn't){_S}(?:to{_S})?load{_S}(?:the{_S})?"
       rf"(?:draft{_S}|target{_S}|main{_S}|mtp{_S}|eagle\d?{_S})?(?:model|drafter|gguf)",
       rf"{_B}(?:draft{_S})?model{_S}load(?:ing)?{_S}(?:failed|error|failure|exception)",
       rf"{_B}error{_S}loading{_S}(?:draft{_S})?model",
       rf"{_B}(?:failed|unable){_S}to{_S}(?:create|initiali[sz]e|init){_S}(?:the{_S})?(?:llama{_S})?context",
       rf"{_B}(?:LoadModel|ModelLoad|LoadWeights){_S}(?:Error|Exception|Failed)",
       # the model file could not be opened: gguf's `failed to open 'PATH': 'No such file or directory'`, a
       # runtime's `unable to open model file`, Go's `open /models/x.gguf: no such file or directory`
       rf"{_B}(?:failed|unable|could{_S}not|cannot|can't|couldn't){_S}(?:to{_S})?open{_S}(?:the{_S})?"
       rf"(?:(?:draft{_S}|target{_S})?model(?:{_S}file)?|gguf(?:{_S}file)?|'[^']*')",
       r"\bopen \S+\.gguf: no such file or directory",
       examples=("llama_load_model_from_file: failed to load model",
                 "LLama.Exceptions.LoadWeightsFailedException: Failed to load model 'model.gguf'",
                 "ValueError: Failed to load model from file: models/7B/ggml-model.gguf",
                 "Error: unable to load draft model",
                 "llama_model_load: error loading model architecture: unknown model architecture: 'qwen35'",
                 "ModelLoadError",
                 "gguf_init_from_file: failed to open 'DRAFT_MODEL_PATH': 'No such file or directory'",
                 "error: unable to open model file models/7B.gguf",
                 "Error: open /root/.ollama/models/blobs/model.gguf: no such file or directory"),
       not_examples=("I load the model with -m and it works", "failed to open the browser tab")),
    # an HTTP error answer from llama-server (its JSON `type` for a 500) or a client that names the status
    _c("server_error", "error",
       r"[\'\"]type[\'\"]\s*:\s*[\'\"]server_error",
       rf"{_B}internal{_S}server{_S}error",
       examples=('{"error":{"code":500,"message":"The model produced output that does not match",'
                 '"type":"server_error"}}',
                 "openai.InternalServerError: Error code: 500",
                 "HTTP/1.1 500 Internal Server Error"),
       not_examples=("the server answered 200 OK",)),
    # a .NET (or Java) exception named by its namespaced class where a line starts, as a wrapper throws it with
    # no llama.cpp line (`System.ObjectDisposedException: Cannot access a disposed object.` from LLamaSharp's
    # context handle): last, so the classes the concepts above name (a load, a decode) keep their kind
    _c("namespaced_exception", "assert",
       r"^\W{0,3}(?:[A-Za-z_]\w*\.)+[A-Z]\w*Exception: ",
       examples=("System.ObjectDisposedException: Cannot access a disposed object.",
                 "java.lang.IllegalStateException: llama context is closed",
                 "System.InvalidOperationException: Sequence contains no elements"),
       not_examples=("See System.Exception: the base class of all errors",
                     "Exception: this is not namespaced")),
)

# a word one of the concepts' wordings needs (lower case): a line without any is not looked at further, which
# keeps the layer off the ordinary lines of a healthy log (its slot, draft and loader lines name none)
_CUES = ("error", "fail", "exception", "abort", "assert", "fault", "throw", "terminat", "crash", "exit status",
         "exit code", "signal", "sigsegv", "sigabrt", "sigill", "sigbus", "sigfpe", "illegal", "violation", "dumped",
         "panic", "nil pointer", "lost", "removed", "hung", "hang", "fallen", "memory", "oom", "full", "exceed",
         "overflow", "mismatch", "inconsistent", "invalid", "consecutive", "continuous", "unable", "could not",
         "cannot", "can't", "couldn't", "nokv", "no kv", "no_kv", "returned", "ret =", "ret=", "unhandled",
         "uncaught", "rejection", "server_error", "internalservererror", "server error", "   at ", "insufficient",
         "not enough", "killed", "panicked", "no longer running", "vk_error", "ur_result", "bus error",
         "floating point", "goroutine", "rax ", "rip ", "eax ", "eip ", " fp=0x", "inferior", "exited with",
         "batch offset=", "bo: addr=", " than ", "n_keep")


BY_NAME: dict[str, Concept] = {c.name: c for c in CONCEPTS}
CRASH = BY_NAME["crash_signal"]
# backtrace frames that only a crash prints: ggml's handlers, the C++ runtime's terminate, libc's abort
CRASH_FRAMES = frozenset(("ggml_print_backtrace", "ggml_abort", "ggml_uncaught_exception", "std::terminate",
                          "abort", "__GI_abort", "raise", "__GI_raise", "__pthread_kill_implementation",
                          "__pthread_kill", "pthread_kill", "__cxa_throw", "_Unwind_Resume"))


def crash_frame(fn: str) -> bool:
    """Whether a backtrace frame's function is one only a crash runs (a paste of frames alone is a crash)."""
    return fn in CRASH_FRAMES


@lru_cache(maxsize=1)  # the walker asks twice of one line (does it need the walker, then what it names)
def recognise(line: str) -> tuple[Concept, re.Match[str]] | None:
    """The concept a line names, and its match; None when it names none."""
    low = line.lower()
    if not any(c in low for c in _CUES):
        return None
    found = _named(line)
    if found is None and (start := parse_prefix(line).start) > 0:
        found = _named(line[start:])  # the wordings that start a line, behind a journald or docker prefix
    return found


def _named(line: str) -> tuple[Concept, re.Match[str]] | None:
    for concept in CONCEPTS:
        m = concept.regex.search(line)
        if m is not None and _NEGATED.search(line, 0, m.start()) is None:
            return concept, m
    return None


# prose that says a failure did NOT happen: `no "decode failed -1" / abort`, `without a segfault`, `never
# crashed with ...`: the negation right before the wording (quotes and markup between them allowed)
_NEGATED = re.compile(r"(?:^|[^a-z])(?:no|without|never)(?:\s+(?:a|an|any))?[\s`'\"*(]*$", re.IGNORECASE)


def code_of(m: re.Match[str]) -> int | None:
    """The return code a concept's match names (`DecodeError(1)`: 1), or None."""
    return next((int(v) for k, v in m.groupdict().items() if k.startswith("ret") and v is not None), None)


def side_of(line: str) -> str:
    """`drafter` when the line itself says the draft side failed (a draft model, MTP, EAGLE, DFlash), else
    `unknown`: a concept never decides the side on less."""
    return "drafter" if _DRAFT_WORDS.search(line) is not None else "unknown"
