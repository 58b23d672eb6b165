/* The walker's hot lines in C: an optional accelerator for analyze/walker.py.
 *
 * `skim(walker, text, pos)` walks the lines of `text` from `pos` and does, for the lines it knows, exactly
 * what Walker.feed does for them: batch-dump lines (fields, token rows and their fragments), find_slot rows,
 * a dump's per-sequence positions, draft hints and lines that are only counted. It stops at the first line
 * it does not know, or one whose handling needs more of the walker than these few fields (a failure being
 * assembled, a dump being flushed, a memo miss), and returns that line's offset: Walker.feed_text hands the
 * line to Walker.feed and calls again. Walker.feed stays the definition; tests run both on the same logs.
 *
 * Text comes from analyze.normalize.decode (Latin-1), so it is always a one-byte string. The regexes
 * emulated here (analyze/patterns.py: batch_field, kv_stream, kv_seq, batch_seq_pos) have no ambiguity to
 * backtrack over, so a straight left-to-right match gives what `re` gives; `\s` is Python's str whitespace.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* the walker's batch-dump states (walker._OUT, _INPUT, _SEQS, _UBATCH) */
enum { DUMP_OUT = 0, DUMP_INPUT = 1, DUMP_SEQS = 2, DUMP_UBATCH = 3 };
/* what a pattern-table entry's lines need (configure's `codes`) */
enum { CODE_WALKER = 0, CODE_COUNTED = 1, CODE_DRAFT_HINT = 2 };
#define MEMO_NONE (-1)  /* walker._first remembered: no entry matches */
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
    A_KV_LINE, A_KV_T, A_KV_CACHE_SIZE, A_KV_STREAM, A_KV_SEQ_ID, A_KV_POS_MIN, A_KV_POS_MAX, A_COUNT
};
static const char *const NAMES[A_COUNT] = {
    "n_lines", "n_recognised", "_fragment", "_kv_size", "_cur_found_slot", "_hint", "_dump", "_failure", "_fields",
    "_cur_rows", "kv", "_batch_t", "_cur_sizes", "_seqs", "batches", "hint", "append",
    "line", "t", "cache_size", "stream", "seq_id", "pos_min", "pos_max",
};
static PyObject *names[A_COUNT];
#define KV_COLUMNS 7 /* A_KV_LINE .. A_KV_POS_MAX, in KvColumns' order */

typedef struct {
    PyObject *walker, *text;
    long long no, recognised, kv_size;
    int dump, dump_changed, fragment, failure_open, kv_size_set, found_slot;
    PyObject *hint;                   /* the latest draft hint, owned */
    PyObject *rows;                   /* walker._cur_rows, owned, fetched when first needed */
    PyObject *kv_append[KV_COLUMNS];  /* walker.kv.<column>.append, owned, fetched when first needed */
} State;

static PyObject *attr(PyObject *o, int name) { return PyObject_GetAttr(o, names[name]); }

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

/* walker._kv for a sequence row: one row in each of the KvColumns */
static int kv_row(State *s, long long no, const long long f[4]) {
    if (s->kv_append[0] == NULL) {
        PyObject *kv = attr(s->walker, A_KV);
        for (int i = 0; kv != NULL && i < KV_COLUMNS; i++) {
            PyObject *column = attr(kv, A_KV_LINE + i);
            s->kv_append[i] = column ? PyObject_GetAttr(column, names[A_APPEND]) : NULL;
            Py_XDECREF(column);
            if (s->kv_append[i] == NULL)
                break;
        }
        Py_XDECREF(kv);
        if (PyErr_Occurred())
            return -1;
    }
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

/* walker._first's memo for this line: its table index, MEMO_NONE, -3 when the walker must look, -4 an error */
static long memo_index(cursor a, cursor e) {
    Py_ssize_t n = e - a;
    for (cursor q = a; q < e; q++)
        n += *q >= 0x80; /* the memo is keyed by the UTF-8 bytes of the text */
    PyObject *key = PyBytes_FromStringAndSize(NULL, n);
    if (key == NULL)
        return -4;
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
        return PyErr_Occurred() ? -4 : -3;
    long v = PyLong_AsLong(idx);
    return v == -1 && PyErr_Occurred() ? -4 : v;
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
    if (s->found_slot)
        SET(A_FOUND_SLOT, PyBool_FromLong(1));
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
}

static long long get_ll(PyObject *o, int name) {
    PyObject *v = attr(o, name);
    long long r = v ? PyLong_AsLongLong(v) : -1;
    Py_XDECREF(v);
    return r;
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
            /* a dump's `seq = [` line: what follows are its sequences' positions */
            cursor last = e;
            while (last > a && is_space(last[-1]))
                last--;
            if (HAS(a, e, "input batch info") || last == a || last[-1] != '[' || !match_seq_open(a, e))
                return 0;
            if (s->dump == DUMP_INPUT) {
                s->dump = DUMP_SEQS;
                s->dump_changed = 1;
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
    long idx = memo_index(a, e);
    if (idx == -4)
        return -1;
    if (idx == MEMO_NONE)
        return memchr(a, '&', (size_t)(e - a)) == NULL; /* an HTML-escaped paste: the walker unescapes it */
    if (idx < 0 || idx >= PyBytes_GET_SIZE(codes) || s->failure_open)
        return 0;
    int code = PyBytes_AS_STRING(codes)[idx];
    if (code == CODE_DRAFT_HINT) {
        if (mark_drafter(s) < 0)
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
    State s = {.walker = walker, .text = text};
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
