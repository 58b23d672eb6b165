/* The walker's most frequent lines in C: an optional accelerator for analyze/reader/walker.py.
 *
 * `skim(walker, text, pos)` walks the lines of `text` from `pos` and does, for the lines it knows, exactly
 * what Walker.feed does for them: a batch dump's lines (its first line, fields, token rows and their
 * fragments, per-sequence positions, its closing line, which writes the batch's rows, and the ubatch
 * repeats), find_slot rows, draft hints, and lines the pattern table only counts or does not know. It stops
 * at the first line it does not know, or one whose handling needs more of the walker's state than this
 * (a failure being assembled, a dump still open when the next begins, a memo miss, an event or meta line),
 * and returns that line's offset: Walker.feed_text hands the line to Walker.feed and calls again.
 * Walker.feed stays the definition; tests/analyze/reader/test_skim.py holds the two to the same state.
 *
 * Text comes from analyze.normalize.decode (Latin-1), so it is always a one-byte string. The regexes
 * emulated here (analyze/reader/patterns.py: batch_field, batch_seq_pos, batch_seq_open, batch_seq_close,
 * kv_stream, kv_seq; normalize.LLAMA_PREFIX) have nothing to backtrack over, so a straight left-to-right
 * match gives what `re` gives; `\s` is Python's str whitespace. The walker's attributes and the columns of
 * records.BatchColumns and KvColumns are read and written by name (NAMES below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

/* the walker's batch-dump states (walker._OUT, _INPUT, _SEQS, _UBATCH) */
enum { DUMP_OUT = 0, DUMP_INPUT = 1, DUMP_SEQS = 2, DUMP_UBATCH = 3 };
/* what a pattern-table entry's lines need (configure's `codes`) */
enum { CODE_WALKER = 0, CODE_COUNTED = 1, CODE_DRAFT_HINT = 2, CODE_HINT = 3 };
#define MEMO_NONE (-1)  /* walker._first remembered: no entry matches (its _EXACT, -2, is the walker's) */
#define MEMO_MISS (-3)  /* not remembered: the walker walks the table */
#define MEMO_ERROR (-4)
#define MAX_DIGITS 18   /* longer numbers go to the walker (Python ints) */

static PyObject *memo;       /* walker._FIRST: digit-masked line -> table index */
static PyObject *codes;      /* bytes: per table index, one of CODE_* */
static PyObject *components; /* tuple: per table index, its component */
static long drafter_code;

typedef const unsigned char *cursor;

/* `lit` in [a, e): memchr for its first byte (a vector scan) and a compare; glibc's memmem sets up a table on
 * every call, which costs more than the search on lines this short */
static cursor find(cursor a, cursor e, const char *lit, size_t n) {
    if ((size_t)(e - a) < n)
        return NULL;
    cursor last = e - n;
    while (a <= last) {
        cursor p = memchr(a, (unsigned char)lit[0], (size_t)(last - a) + 1);
        if (p == NULL)
            return NULL;
        if (memcmp(p + 1, lit + 1, n - 1) == 0)
            return p;
        a = p + 1;
    }
    return NULL;
}
#define FIND(a, e, lit) find((a), (e), (lit), sizeof(lit) - 1)
#define HAS(a, e, lit) (FIND(a, e, lit) != NULL)

/* Python's str.isspace for one-byte characters */
static int is_space(unsigned char c) { return (c >= 9 && c <= 13) || (c >= 28 && c <= 32) || c == 133 || c == 160; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int literal(cursor *p, cursor e, const char *s, size_t n) {
    if ((size_t)(e - *p) < n || memcmp(*p, s, n) != 0)
        return 0;
    *p += n;
    return 1;
}
#define LIT(p, e, s) literal((p), (e), (s), sizeof(s) - 1)

static void spaces(cursor *p, cursor e) {
    while (*p < e && is_space(**p))
        (*p)++;
}

/* \d+ (or -?\d+ when `sign`) into *out; 0 when there is none, or one too long to hold here */
static int number(cursor *p, cursor e, int sign, long long *out) {
    cursor q = *p;
    int neg = 0;
    if (sign && q < e && *q == '-') {
        neg = 1;
        q++;
    }
    cursor start = q;
    long long v = 0;
    while (q < e && is_digit(*q)) {
        if (q - start >= MAX_DIGITS)
            return 0;
        v = v * 10 + (*q - '0');
        q++;
    }
    if (q == start)
        return 0;
    *out = neg ? -v : v;
    *p = q;
    return 1;
}

/* kv_stream: find_slot: stream\[\d+\], n = \s*\d+, used = \s*\d+, head = \s*\d+, size = \s*(?P<size>\d+) */
static int match_kv_stream(cursor p, cursor e, long long *size) {
    long long v;
    for (cursor at; (at = FIND(p, e, "find_slot: stream[")) != NULL; p = at + 1) {
        cursor q = at + 18;
        if (number(&q, e, 0, &v) && LIT(&q, e, "], n = ") && (spaces(&q, e), number(&q, e, 0, &v)) &&
            LIT(&q, e, ", used = ") && (spaces(&q, e), number(&q, e, 0, &v)) && LIT(&q, e, ", head = ") &&
            (spaces(&q, e), number(&q, e, 0, &v)) && LIT(&q, e, ", size = ") && (spaces(&q, e), number(&q, e, 0, size)))
            return 1;
    }
    return 0;
}

/* kv_seq: find_slot: stream\[(\d+)\] min\[(\d+)\] = \s*(-?\d+), max\[\d+\] = \s*(-?\d+) */
static int match_kv_seq(cursor p, cursor e, long long out[4]) {
    long long v;
    for (cursor at; (at = FIND(p, e, "find_slot: stream[")) != NULL; p = at + 1) {
        cursor q = at + 18;
        if (number(&q, e, 0, &out[0]) && LIT(&q, e, "] min[") && number(&q, e, 0, &out[1]) && LIT(&q, e, "] = ") &&
            (spaces(&q, e), number(&q, e, 1, &out[2])) && LIT(&q, e, ", max[") && number(&q, e, 0, &v) &&
            LIT(&q, e, "] = ") && (spaces(&q, e), number(&q, e, 1, &out[3])))
            return 1;
    }
    return 0;
}

/* batch_seq_pos: init:\s+(\d+): pos = \[\s*(-?\d+),\s*(-?\d+)\] */
static int match_seq_pos(cursor p, cursor e, long long out[3]) {
    for (cursor at; (at = FIND(p, e, "init:")) != NULL; p = at + 1) {
        cursor q = at + 5;
        if (q >= e || !is_space(*q))
            continue;
        spaces(&q, e);
        if (number(&q, e, 0, &out[0]) && LIT(&q, e, ": pos = [") && (spaces(&q, e), number(&q, e, 1, &out[1])) &&
            LIT(&q, e, ",") && (spaces(&q, e), number(&q, e, 1, &out[2])) && LIT(&q, e, "]"))
            return 1;
    }
    return 0;
}

/* batch_seq_open: init:\s+seq\s+= \[ */
static int match_seq_open(cursor p, cursor e) {
    for (cursor at; (at = FIND(p, e, "init:")) != NULL; p = at + 1) {
        cursor q = at + 5;
        if (q >= e || !is_space(*q))
            continue;
        spaces(&q, e);
        if (!LIT(&q, e, "seq") || q >= e || !is_space(*q))
            continue;
        spaces(&q, e);
        if (LIT(&q, e, "= ["))
            return 1;
    }
    return 0;
}

/* batch_field: ubatch_print:\s+(?P<key>[a-z_]+)\s*= (?P<value>\S*), into walker._fields */
static int set_field(cursor base, cursor p, cursor e, PyObject *text, PyObject *fields) {
    for (cursor at; (at = FIND(p, e, "ubatch_print:")) != NULL; p = at + 1) {
        cursor q = at + 13, key, key_end, value;
        if (q >= e || !is_space(*q))
            continue;
        spaces(&q, e);
        key = q;
        while (q < e && ((*q >= 'a' && *q <= 'z') || *q == '_'))
            q++;
        if (q == key)
            continue;
        key_end = q;
        spaces(&q, e);
        if (!LIT(&q, e, "= "))
            continue;
        value = q;
        while (q < e && !is_space(*q))
            q++;
        PyObject *k = PyUnicode_Substring(text, key - base, key_end - base);
        PyObject *v = k ? PyUnicode_Substring(text, value - base, q - base) : NULL;
        int rc = v ? PyDict_SetItem(fields, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        return rc;
    }
    return 0;
}

/* attribute names, interned once */
enum {
    A_N_LINES, A_N_RECOGNISED, A_FRAGMENT, A_KV_SIZE, A_FOUND_SLOT, A_HINT, A_DUMP, A_FAILURE, A_FIELDS,
    A_CUR_ROWS, A_KV, A_BATCH_T, A_CUR_SIZES, A_SEQS, A_BATCHES, A_HINT_COLUMN, A_APPEND,
    A_KV_LINE, A_KV_T, A_KV_CACHE_SIZE, A_KV_STREAM, A_KV_SEQ_ID, A_KV_POS_MIN, A_KV_POS_MAX,
    A_B_BATCH, A_B_LINE, A_B_T, A_B_SEQ_ID, A_B_N_TOKENS, A_B_POS_MIN, A_B_POS_MAX, A_B_N_OUTPUTS, A_B_EMBD, A_B_OK,
    A_B_SIG, A_B_HINT, A_B_BUF,
    A_SIGS, A_BATCH_LINE, A_N_BATCHES, A_REQUESTS, A_BUFFERS, A_BUFFER_REQUEST,
    A_F_N_TOKENS, A_F_N_OUTPUTS, A_F_EMBD, A_F_POS, A_COUNT
};
static const char *const NAMES[A_COUNT] = {
    "n_lines", "n_recognised", "_fragment", "_kv_size", "_cur_found_slot", "_hint", "_dump", "_failure", "_fields",
    "_cur_rows", "kv", "_batch_t", "_cur_sizes", "_seqs", "batches", "hint", "append",
    "line", "t", "cache_size", "stream", "seq_id", "pos_min", "pos_max",
    "batch", "line", "t", "seq_id", "n_tokens", "pos_min", "pos_max", "n_outputs", "embd", "ok",
    "sig", "hint", "buf",
    "_sigs", "_batch_line", "_n_batches", "_requests", "buffers", "buffer_request",
    "n_tokens", "n_outputs", "embd", "pos",
};
static PyObject *names[A_COUNT];
#define KV_COLUMNS 7     /* A_KV_LINE .. A_KV_POS_MAX, in KvColumns' order */
#define BATCH_COLUMNS 13 /* A_B_BATCH .. A_B_BUF, in BatchColumns' order */
#define NA LLONG_MIN     /* records.NA */

typedef struct {
    PyObject *walker, *text;
    long long no, recognised, kv_size;
    int dump, dump_changed, fragment, failure_open, kv_size_set;
    int found_slot; /* walker._cur_found_slot as set here, -1 when not set */
    PyObject *hint;                   /* the latest draft hint, owned */
    PyObject *rows;                   /* walker._cur_rows, owned, fetched when first needed */
    PyObject *kv_append[KV_COLUMNS];  /* walker.kv.<column>.append, owned, fetched when first needed */
    PyObject *batch_append[BATCH_COLUMNS]; /* walker.batches.<column>.append, the same */
} State;

static PyObject *attr(PyObject *o, int name) { return PyObject_GetAttr(o, names[name]); }

static long long get_ll(PyObject *o, int name) {
    PyObject *v = attr(o, name);
    long long r = v ? PyLong_AsLongLong(v) : -1;
    Py_XDECREF(v);
    return r;
}

static PyObject *cur_rows(State *s) {
    if (s->rows == NULL) {
        s->rows = attr(s->walker, A_CUR_ROWS);
        if (s->rows != NULL && !PyList_Check(s->rows)) {
            PyErr_SetString(PyExc_TypeError, "skim: walker._cur_rows is not a list");
            Py_CLEAR(s->rows);
        }
    }
    return s->rows;
}

static int append(PyObject *method, PyObject *value) {
    if (value == NULL)
        return -1;
    PyObject *r = PyObject_CallOneArg(method, value);
    Py_DECREF(value);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* the append methods of a column record's arrays (KvColumns, BatchColumns), fetched once per call */
static int appends(PyObject *walker, int record, int first, int n, PyObject **out) {
    if (out[0] != NULL)
        return 0;
    PyObject *columns = attr(walker, record);
    for (int i = 0; columns != NULL && i < n; i++) {
        PyObject *column = attr(columns, first + i);
        out[i] = column ? PyObject_GetAttr(column, names[A_APPEND]) : NULL;
        Py_XDECREF(column);
        if (out[i] == NULL)
            break;
    }
    Py_XDECREF(columns);
    return PyErr_Occurred() ? -1 : 0;
}

/* walker._kv for a sequence row: one row in each of the KvColumns */
static int kv_row(State *s, long long no, const long long f[4]) {
    if (appends(s->walker, A_KV, A_KV_LINE, KV_COLUMNS, s->kv_append) < 0)
        return -1;
    /* find_slot runs microseconds after its batch's dump: the walker reuses that time */
    if (append(s->kv_append[1], attr(s->walker, A_BATCH_T)) < 0 ||
        append(s->kv_append[0], PyLong_FromLongLong(no)) < 0 ||
        append(s->kv_append[2], PyLong_FromLongLong(s->kv_size)) < 0)
        return -1;
    for (int i = 0; i < 4; i++)
        if (append(s->kv_append[3 + i], PyLong_FromLongLong(f[i])) < 0)
            return -1;
    return 0;
}

static int set_attr(PyObject *o, int name, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = PyObject_SetAttr(o, names[name], value);
    Py_DECREF(value);
    return rc;
}

/* llama.cpp's own prefix at the start of a line (normalize.LLAMA_PREFIX, matched): its seconds, as
 * normalize.llama_seconds computes them; 0 when the line has another prefix (the walker reads those) */
static int prefix_seconds(cursor p, cursor e, double *out) {
    long long m, sec = 0, ms = 0, us = 0;
    if (!number(&p, e, 0, &m) || !LIT(&p, e, "."))
        return 0;
    for (int i = 0; i < 10; i++) { /* SS.mmm.uuu */
        if (i == 2 || i == 6) {
            if (!LIT(&p, e, "."))
                return 0;
            continue;
        }
        if (p >= e || !is_digit(*p))
            return 0;
        long long *field = i < 2 ? &sec : i < 6 ? &ms : &us;
        *field = *field * 10 + (*p++ - '0');
    }
    if (!LIT(&p, e, " ") || m > (1LL << 40))
        return 0;
    /* the same operations in the same order as llama_seconds: int + float + float */
    *out = (double)(m * 60 + sec) + (double)ms / 1e3 + (double)us / 1e6;
    return 1;
}

/* walker._end_batch when no dump is open: the finished batch's rows get the signature of the cache sizes
 * find_slot showed for them, and the next batch starts with none */
static int end_batch(State *s) {
    PyObject *rows = cur_rows(s);
    PyObject *sizes = rows ? attr(s->walker, A_CUR_SIZES) : NULL;
    if (sizes == NULL)
        return -1;
    int rc = 0;
    if (PyList_GET_SIZE(rows) > 0 && PyObject_Length(sizes) > 0) {
        PyObject *key = PyFrozenSet_New(sizes);
        PyObject *sigs = key ? attr(s->walker, A_SIGS) : NULL;
        PyObject *n = sigs ? PyLong_FromSsize_t(PyDict_Size(sigs)) : NULL;
        PyObject *sig = n ? PyDict_SetDefault(sigs, key, n) : NULL; /* borrowed */
        PyObject *batches = sig ? attr(s->walker, A_BATCHES) : NULL;
        PyObject *column = batches ? attr(batches, A_B_SIG) : NULL;
        rc = column ? 0 : -1;
        for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(rows); i++)
            rc = PyObject_SetItem(column, PyList_GET_ITEM(rows, i), sig);
        Py_XDECREF(column);
        Py_XDECREF(batches);
        Py_XDECREF(n);
        Py_XDECREF(sigs);
        Py_XDECREF(key);
    }
    Py_DECREF(sizes);
    if (rc < 0 || set_attr(s->walker, A_CUR_SIZES, PySet_New(NULL)) < 0)
        return -1;
    Py_CLEAR(s->rows);
    s->rows = PyList_New(0);
    return s->rows ? PyObject_SetAttr(s->walker, names[A_CUR_ROWS], s->rows) : -1;
}

/* the `input batch info:` line: walker._batch("input") when no dump is open; 0 when the walker must */
static int input_batch(State *s, cursor a, cursor e, long long no) {
    double t;
    if (!prefix_seconds(a, e, &t))
        return 0;
    if (end_batch(s) < 0 || set_attr(s->walker, A_FIELDS, PyDict_New()) < 0 ||
        set_attr(s->walker, A_SEQS, PyList_New(0)) < 0 ||
        set_attr(s->walker, A_BATCH_LINE, PyLong_FromLongLong(no)) < 0 ||
        set_attr(s->walker, A_BATCH_T, PyFloat_FromDouble(t)) < 0)
        return -1;
    s->dump = DUMP_INPUT;
    s->dump_changed = 1;
    return 1;
}

static int is_nil(PyObject *v) { /* walker._NIL */
    static const char *const nil[] = {"(nil)", "0x0", "(null)", "0", "NULL"};
    for (size_t i = 0; i < sizeof nil / sizeof nil[0]; i++)
        if (PyUnicode_CompareWithASCIIString(v, nil[i]) == 0)
            return 1;
    return 0;
}

/* walker._int_or_na of a field: int() of its text, NA where that fails or needs more than 64 bits */
static int field_int(PyObject *fields, int name, long long *out) {
    *out = NA;
    PyObject *v = PyDict_GetItem(fields, names[name]); /* borrowed; plain text, checked */
    if (v == NULL)
        return 0;
    PyObject *n = PyLong_FromUnicodeObject(v, 10);
    if (n == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(n, &overflow);
    Py_DECREF(n);
    if (!overflow && x != NA)
        *out = x;
    return PyErr_Occurred() ? -1 : 0;
}

/* a str as decode makes them, or NULL (absent); anything else is not the walker's own state */
static int plain_text(PyObject *v) { return v == NULL || (PyUnicode_CheckExact(v) && PyUnicode_KIND(v) == PyUnicode_1BYTE_KIND); }

/* whether the state _flush_input reads is what the walker itself keeps (else the walker flushes) */
static int flushable(PyObject *fields, PyObject *seqs, PyObject *hint) {
    if (!PyDict_CheckExact(fields) || !PyList_CheckExact(seqs))
        return 0;
    const int keys[] = {A_F_N_TOKENS, A_F_N_OUTPUTS, A_F_EMBD, A_F_POS};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!plain_text(PyDict_GetItem(fields, names[keys[i]])))
            return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seqs); i++) {
        PyObject *row = PyList_GET_ITEM(seqs, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 3)
            return 0;
        for (int j = 0; j < 3; j++)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(row, j)))
                return 0;
    }
    return hint == Py_None || (PyTuple_CheckExact(hint) && PyTuple_GET_SIZE(hint) == 3 &&
                               PyLong_CheckExact(PyTuple_GET_ITEM(hint, 0)));
}

/* walker._flush_input for a dump closed by its `]` line: one row per sequence of the input batch.
 * 1 done, 0 the walker must do it (nothing changed yet), -1 an error. */
static int flush_input(State *s, PyObject *hint_now) {
    PyObject *w = s->walker;
    PyObject *fields = attr(w, A_FIELDS);
    PyObject *seqs = fields ? attr(w, A_SEQS) : NULL;
    PyObject *t = seqs ? attr(w, A_BATCH_T) : NULL;
    long long n_tokens, n_outputs, embd = -1, buf = NA, requests, batch_line, batch_no;
    int rc = -1;
    if (t == NULL)
        goto done;
    if (!flushable(fields, seqs, hint_now)) {
        rc = 0;
        goto done;
    }
    requests = get_ll(w, A_REQUESTS);
    batch_line = get_ll(w, A_BATCH_LINE);
    batch_no = get_ll(w, A_N_BATCHES);
    if (PyErr_Occurred() || field_int(fields, A_F_N_TOKENS, &n_tokens) < 0 ||
        field_int(fields, A_F_N_OUTPUTS, &n_outputs) < 0)
        goto done;
    PyObject *v = PyDict_GetItem(fields, names[A_F_EMBD]); /* borrowed; plain text, checked */
    if (v != NULL) {
        /* a pointer that is not null: `embd not in _NIL and embd.strip("0x") != ""` */
        embd = 0;
        if (!is_nil(v)) {
            const unsigned char *c = PyUnicode_1BYTE_DATA(v);
            for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(v); i++)
                embd |= c[i] != '0' && c[i] != 'x';
        }
    }
    PyObject *ptr = PyDict_GetItem(fields, names[A_F_POS]); /* borrowed; plain text, checked */
    if (ptr != NULL && PyUnicode_GET_LENGTH(ptr) > 0 && !is_nil(ptr)) {
        /* keyed per request too: a freed batch's address can come back as the other context's buffer */
        PyObject *key = PyUnicode_FromFormat("%U@%lld", ptr, requests);
        PyObject *buffers = key ? attr(w, A_BUFFERS) : NULL;
        PyObject *n = buffers ? PyLong_FromSsize_t(PyDict_Size(buffers)) : NULL;
        PyObject *id = n ? PyDict_SetDefault(buffers, key, n) : NULL; /* borrowed */
        buf = id ? PyLong_AsLongLong(id) : -1;
        Py_XDECREF(n);
        Py_XDECREF(buffers);
        Py_XDECREF(key);
        if (id == NULL || PyErr_Occurred())
            goto done;
        /* the request each buffer was first seen in */
        PyObject *firsts = attr(w, A_BUFFER_REQUEST);
        int bad = firsts == NULL;
        if (!bad && buf == PyObject_Length(firsts)) {
            PyObject *r = PyLong_FromLongLong(requests);
            bad = r == NULL || PyList_Append(firsts, r) < 0;
            Py_XDECREF(r);
        }
        Py_XDECREF(firsts);
        if (bad || PyErr_Occurred())
            goto done;
    }
    /* a batch dumped right after a slot's prompt line is that slot's (the target's) prompt */
    long long hint = 0;
    if (hint_now != Py_None) {
        long long at = PyLong_AsLongLong(PyTuple_GET_ITEM(hint_now, 0));
        PyObject *side = PyTuple_GET_ITEM(hint_now, 1);
        if (PyErr_Occurred())
            goto done;
        if (batch_line - at <= 3 && PyUnicode_Check(side) && PyUnicode_CompareWithASCIIString(side, "target") == 0)
            hint = 1; /* records.CONTEXT_CODES["target"] */
    }
    if (set_attr(w, A_N_BATCHES, PyLong_FromLongLong(batch_no + 1)) < 0 ||
        set_attr(w, A_CUR_SIZES, PySet_New(NULL)) < 0)
        goto done;
    s->found_slot = 0;
    Py_CLEAR(s->rows);
    if ((s->rows = PyList_New(0)) == NULL || PyObject_SetAttr(w, names[A_CUR_ROWS], s->rows) < 0 ||
        appends(w, A_BATCHES, A_B_BATCH, BATCH_COLUMNS, s->batch_append) < 0)
        goto done;
    PyObject *batches = attr(w, A_BATCHES);
    PyObject *lines = batches ? attr(batches, A_B_LINE) : NULL;
    Py_XDECREF(batches);
    Py_ssize_t first_row = lines ? PyObject_Length(lines) : -1;
    Py_XDECREF(lines);
    if (first_row < 0)
        goto done;
    Py_ssize_t n_seqs = PyList_GET_SIZE(seqs);
    for (Py_ssize_t i = 0; i < (n_seqs ? n_seqs : 1); i++) {
        long long seq[3] = {NA, NA, NA}; /* a dump without sequences is one row of NA */
        for (int j = 0; n_seqs && j < 3; j++)
            seq[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(PyList_GET_ITEM(seqs, i), j));
        if (PyErr_Occurred())
            goto done;
        PyObject *row_no = PyLong_FromSsize_t(first_row + i);
        int appended = row_no ? PyList_Append(s->rows, row_no) : -1;
        Py_XDECREF(row_no);
        if (appended < 0)
            goto done;
        const long long values[BATCH_COLUMNS] = {batch_no, batch_line, 0, seq[0], n_tokens, seq[1], seq[2],
                                                 n_outputs, embd, 1, -1, hint, buf};
        for (int j = 0; j < BATCH_COLUMNS; j++) {
            PyObject *value = j == 2 ? (Py_INCREF(t), t) : PyLong_FromLongLong(values[j]); /* column t */
            if (append(s->batch_append[j], value) < 0)
                goto done;
        }
    }
    s->dump = DUMP_OUT;
    s->dump_changed = 1;
    rc = 1;
done:
    Py_XDECREF(t);
    Py_XDECREF(seqs);
    Py_XDECREF(fields);
    return rc;
}

/* batch_seq_close: init:\s+\]\s*$ */
static int match_seq_close(cursor p, cursor e) {
    for (cursor at; (at = FIND(p, e, "init:")) != NULL; p = at + 1) {
        cursor q = at + 5;
        if (q >= e || !is_space(*q))
            continue;
        spaces(&q, e);
        if (!LIT(&q, e, "]"))
            continue;
        spaces(&q, e);
        if (q == e)
            return 1;
    }
    return 0;
}

/* walker._mark_drafter: the rows of the latest input batch that no line named yet were the drafter's */
static int mark_drafter(State *s) {
    PyObject *rows = cur_rows(s);
    if (rows == NULL)
        return -1;
    if (PyList_GET_SIZE(rows) == 0)
        return 0;
    PyObject *batches = attr(s->walker, A_BATCHES);
    PyObject *hint = batches ? attr(batches, A_HINT_COLUMN) : NULL;
    Py_XDECREF(batches);
    if (hint == NULL)
        return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(hint, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(hint);
        return -1;
    }
    int rc = 0;
    signed char *cells = view.buf;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        Py_ssize_t r = PyLong_AsSsize_t(PyList_GET_ITEM(rows, i));
        if (view.itemsize != 1 || r < 0 || r >= view.len) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_IndexError, "skim: a batch row outside the hint column");
            rc = -1;
            break;
        }
        if (cells[r] == 0)
            cells[r] = (signed char)drafter_code;
    }
    PyBuffer_Release(&view);
    Py_DECREF(hint);
    return rc;
}

/* walker._first's memo for this line: its table index, MEMO_NONE, MEMO_MISS or MEMO_ERROR */
static long memo_index(cursor a, cursor e) {
    Py_ssize_t n = e - a;
    for (cursor q = a; q < e; q++)
        n += *q >= 0x80; /* the memo is keyed by the UTF-8 bytes of the text */
    PyObject *key = PyBytes_FromStringAndSize(NULL, n);
    if (key == NULL)
        return MEMO_ERROR;
    unsigned char *k = (unsigned char *)PyBytes_AS_STRING(key);
    for (cursor q = a; q < e; q++) {
        unsigned char c = *q;
        if (c >= 0x80) {
            *k++ = 0xC0 | (c >> 6);
            *k++ = 0x80 | (c & 0x3F);
        } else {
            *k++ = (c >= '1' && c <= '9') ? '0' : c; /* walker._MASK_DIGITS */
        }
    }
    PyObject *idx = PyDict_GetItemWithError(memo, key);
    Py_DECREF(key);
    if (idx == NULL)
        return PyErr_Occurred() ? MEMO_ERROR : MEMO_MISS;
    long v = PyLong_AsLong(idx);
    return v == -1 && PyErr_Occurred() ? MEMO_ERROR : v;
}

static int store(State *s) {
    int rc = 0;
    PyObject *v;
#define SET(name, expr)                                                 \
    if (rc == 0) {                                                      \
        v = (expr);                                                     \
        rc = v ? PyObject_SetAttr(s->walker, names[name], v) : -1;      \
        Py_XDECREF(v);                                                  \
    }
    SET(A_N_LINES, PyLong_FromLongLong(s->no));
    SET(A_N_RECOGNISED, PyLong_FromLongLong(s->recognised));
    SET(A_FRAGMENT, PyBool_FromLong(s->fragment));
    if (s->dump_changed)
        SET(A_DUMP, PyLong_FromLong(s->dump));
    if (s->kv_size_set)
        SET(A_KV_SIZE, PyLong_FromLongLong(s->kv_size));
    if (s->found_slot >= 0)
        SET(A_FOUND_SLOT, PyBool_FromLong(s->found_slot));
    if (s->hint && rc == 0)
        rc = PyObject_SetAttr(s->walker, names[A_HINT], s->hint);
#undef SET
    return rc;
}

static void release(State *s) {
    Py_CLEAR(s->hint);
    Py_CLEAR(s->rows);
    for (int i = 0; i < KV_COLUMNS; i++)
        Py_CLEAR(s->kv_append[i]);
    for (int i = 0; i < BATCH_COLUMNS; i++)
        Py_CLEAR(s->batch_append[i]);
}

static int blank(char c) { return c == ' ' || c == '\t'; }

/* A Markdown fence at a line's start, as analyze/reader/proof.py's _FENCE matches it: up to 3 blanks, quote marks
 * (each with one blank after it or none), up to 3 blanks, then ``` or ~~~. Only the start is looked at. */
static int fence_start(cursor a, cursor e) {
    for (int n = 0; n < 3 && a < e && blank(*a); n++)
        a++;
    while (a < e && *a == '>') {
        a++;
        if (a < e && blank(*a))
            a++;
    }
    for (int n = 0; n < 3 && a < e && blank(*a); n++)
        a++;
    return e - a >= 3 && ((a[0] == '`' && a[1] == '`' && a[2] == '`') || (a[0] == '~' && a[1] == '~' && a[2] == '~'));
}

/* One line the walker would handle in a known way: 1 done, 0 the walker must see it, -1 an error. */
static int line(State *s, cursor base, cursor a, cursor e) {
    long long no = s->no + 1;
    if (HAS(a, e, "ubatch_print:")) {
        if (s->dump == DUMP_INPUT) {
            if (HAS(a, e, ": id = ") || HAS(a, e, "[embd]")) {
                s->fragment = !HAS(a, e, "output = ");
            } else if (HAS(a, e, "n_tokens") || HAS(a, e, "n_outputs") || HAS(a, e, "embd") || HAS(a, e, ":   pos ")) {
                PyObject *fields = attr(s->walker, A_FIELDS);
                int rc = fields ? set_field(base, a, e, s->text, fields) : -1;
                Py_XDECREF(fields);
                if (rc < 0)
                    return -1;
            }
        }
        return 1;
    }
    if (s->fragment) {
        s->fragment = 0;
        if (HAS(a, e, "output = "))
            return 1;
        if (!HAS(a, e, "init:") && !HAS(a, e, "ubatch")) {
            s->fragment = 1;
            return 1;
        }
    }
    if (HAS(a, e, "find_slot: stream[")) {
        if (s->failure_open || s->dump == DUMP_INPUT || s->dump == DUMP_SEQS)
            return 0;
        if (HAS(a, e, "] min[")) {
            long long f[4];
            if (!match_kv_seq(a, e, f))
                return 0;
            PyObject *rows = cur_rows(s);
            if (rows == NULL)
                return -1;
            if (PyList_GET_SIZE(rows) == 0)
                return 0; /* its time comes from the line itself: the walker reads it */
            if (kv_row(s, no, f) < 0)
                return -1;
        } else {
            long long size;
            if (!match_kv_stream(a, e, &size))
                return 0;
            PyObject *sizes = attr(s->walker, A_CUR_SIZES);
            PyObject *value = sizes ? PyLong_FromLongLong(size) : NULL;
            int rc = value ? PySet_Add(sizes, value) : -1;
            Py_XDECREF(value);
            Py_XDECREF(sizes);
            if (rc < 0)
                return -1;
            s->kv_size = size;
            s->kv_size_set = 1;
            s->found_slot = 1;
        }
        s->recognised++;
        return 1;
    }
    if (HAS(a, e, "init:")) {
        long long f[3];
        if (s->failure_open)
            return 0;
        if (!HAS(a, e, ": pos = [")) {
            if (HAS(a, e, "input batch info")) {
                /* a new input batch's dump (one still open is the walker's to finish) */
                if (!HAS(a, e, "input batch info:") || s->dump == DUMP_INPUT || s->dump == DUMP_SEQS)
                    return 0;
                int rc = input_batch(s, a, e, no);
                if (rc <= 0)
                    return rc;
                s->recognised++;
                return 1;
            }
            cursor last = e; /* the walker picks the line's entry by its last character */
            while (last > a && is_space(last[-1]))
                last--;
            if (last > a && last[-1] == '[' && match_seq_open(a, e)) {
                /* a dump's `seq = [` line: what follows are its sequences' positions */
                if (s->dump == DUMP_INPUT) {
                    s->dump = DUMP_SEQS;
                    s->dump_changed = 1;
                }
            } else if (last > a && last[-1] == ']' && match_seq_close(a, e)) {
                /* the dump's end: its rows are written */
                if (s->dump == DUMP_SEQS) {
                    PyObject *hint = s->hint ? (Py_INCREF(s->hint), s->hint) : attr(s->walker, A_HINT);
                    int rc = hint ? flush_input(s, hint) : -1;
                    Py_XDECREF(hint);
                    if (rc <= 0)
                        return rc;
                }
            } else {
                return 0;
            }
            s->recognised++;
            return 1;
        }
        if (!match_seq_pos(a, e, f))
            return 0;
        if (s->dump == DUMP_SEQS) {
            PyObject *seqs = attr(s->walker, A_SEQS);
            PyObject *row = seqs ? Py_BuildValue("(LLL)", f[0], f[1], f[2]) : NULL;
            int rc = row ? PyList_Append(seqs, row) : -1;
            Py_XDECREF(row);
            Py_XDECREF(seqs);
            if (rc < 0)
                return -1;
        }
        s->recognised++;
        return 1;
    }
    if (HAS(a, e, "added ubatch to split")) {
        /* a ubatch's dump follows: its lines repeat the input batch's (a dump still open is the walker's) */
        if (s->failure_open || s->dump == DUMP_INPUT || s->dump == DUMP_SEQS)
            return 0;
        s->dump = DUMP_UBATCH;
        s->dump_changed = 1;
        s->recognised++;
        return 1;
    }
    /* a Markdown fence may open or close a block (quoted C/C++ source is skipped to its end): the walker's */
    if (fence_start(a, e))
        return 0;
    long idx = memo_index(a, e);
    if (idx == MEMO_ERROR)
        return -1;
    if (idx == MEMO_NONE)
        return memchr(a, '&', (size_t)(e - a)) == NULL; /* an HTML-escaped paste: the walker unescapes it */
    if (idx < 0 || idx >= PyBytes_GET_SIZE(codes) || s->failure_open)
        return 0;
    int code = PyBytes_AS_STRING(codes)[idx];
    if (code == CODE_DRAFT_HINT || code == CODE_HINT) {
        if (code == CODE_DRAFT_HINT && mark_drafter(s) < 0)
            return -1;
        PyObject *text = PyUnicode_Substring(s->text, a - base, e - base);
        PyObject *hint = text ? Py_BuildValue("(LOO)", no, PyTuple_GET_ITEM(components, idx), text) : NULL;
        Py_XDECREF(text);
        if (hint == NULL)
            return -1;
        Py_XSETREF(s->hint, hint);
    } else if (code != CODE_COUNTED) {
        return 0;
    }
    s->recognised++;
    return 1;
}

static PyObject *skim(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyUnicode_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "skim(walker, text: str, pos: int)");
        return NULL;
    }
    if (memo == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "skim: configure() was not called");
        return NULL;
    }
    PyObject *walker = args[0], *text = args[1];
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    if (PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND)
        return PyLong_FromLong(-1); /* not the reader's Latin-1 text: the walker reads it all */
    cursor base = PyUnicode_1BYTE_DATA(text), end = base + PyUnicode_GET_LENGTH(text);
    if (pos < 0 || pos > end - base) {
        PyErr_SetString(PyExc_ValueError, "skim: position outside the text");
        return NULL;
    }
    State s = {.walker = walker, .text = text, .found_slot = -1};
    s.no = get_ll(walker, A_N_LINES);
    s.recognised = get_ll(walker, A_N_RECOGNISED);
    s.kv_size = get_ll(walker, A_KV_SIZE);
    s.dump = (int)get_ll(walker, A_DUMP);
    if (PyErr_Occurred())
        return NULL;
    PyObject *v = attr(walker, A_FRAGMENT);
    s.fragment = v ? PyObject_IsTrue(v) : -1;
    Py_XDECREF(v);
    if (s.fragment < 0)
        return NULL;
    v = attr(walker, A_FAILURE);
    if (v == NULL)
        return NULL;
    s.failure_open = v != Py_None;
    Py_DECREF(v);
    cursor a = base + pos;
    int rc = 1;
    while (a < end) {
        cursor nl = memchr(a, '\n', (size_t)(end - a));
        cursor e = nl ? nl : end;
        rc = line(&s, base, a, e);
        if (rc <= 0)
            break;
        s.no++;
        a = nl ? nl + 1 : end;
    }
    if (rc < 0 || store(&s) < 0) {
        release(&s);
        return NULL;
    }
    release(&s);
    return PyLong_FromSsize_t(a - base);
}

static PyObject *configure(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *m, *c, *comp;
    long drafter;
    if (!PyArg_ParseTuple(args, "O!O!O!l:configure", &PyDict_Type, &m, &PyBytes_Type, &c, &PyTuple_Type, &comp,
                          &drafter))
        return NULL;
    if (PyTuple_GET_SIZE(comp) != PyBytes_GET_SIZE(c)) {
        PyErr_SetString(PyExc_ValueError, "configure: one code and one component per table entry");
        return NULL;
    }
    Py_INCREF(m);
    Py_INCREF(c);
    Py_INCREF(comp);
    Py_XSETREF(memo, m);
    Py_XSETREF(codes, c);
    Py_XSETREF(components, comp);
    drafter_code = drafter;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"skim", (PyCFunction)(void (*)(void))skim, METH_FASTCALL,
     "skim(walker, text, pos) -> offset of the first line the walker must see (-1: all of them)"},
    {"configure", configure, METH_VARARGS, "configure(memo, codes, components, drafter_code)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, .m_name = "analyze._skim", .m_size = -1,
                                        .m_methods = methods};

PyMODINIT_FUNC PyInit__skim(void) {
    for (int i = 0; i < A_COUNT; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(NAMES[i])) == NULL)
            return NULL;
    return PyModule_Create(&module_def);
}
