"""LMDB dataset format: one environment directory, one named sub-database per field.

Layout (all values are the field's bytes exactly as given; nothing is pickled):

* ``<field>``   : 8-byte big-endian index -> bytes of that field
* ``__keys__``  : index -> sample key (UTF-8)
* ``__index__`` : sample key -> index
* ``__meta__``  : ``b"meta"`` -> JSON metadata record
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import struct
import threading
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import lmdb
import numpy as np

from ...errors import DuplicateKeyError, FormatError, SampleError
from ..base import Store, key_hasher
from ..encoding import split_sample
from ..keys import INDEX_KEY, validate_field, validate_key
from ..meta import LMDB_FORMAT, FieldStats, make_metadata
from ..write.atomic import AtomicDirectory, AtomicWriter
from .fork_gate import FORK_GATE
from .map_trimmer import MapTrimmer, forget_trimmers, maybe_trim

KEYS_DB, INDEX_DB, META_DB = b"__keys__", b"__index__", b"__meta__"
MAX_DBS = 1024

# One environment per (process, path): py-lmdb refuses a path twice; none is used across fork().
_ENVS: dict[str, tuple[lmdb.Environment, dict]] = {}
_ENVS_LOCK = threading.Lock()
_ENV_FILES: dict[str, tuple[int, ...] | None] = {}  # path -> identity of the data.mdb mapped
_INHERITED: dict[str, tuple[lmdb.Environment, dict]] = {}  # a forked child's copies of the parent's, to close


def _file_id(path: str) -> tuple[int, ...] | None:
    """Device and inode: a dataset written again is a new file (its inode cannot be the old one's
    while the old environment holds that file open); a file changed in place is the same file,
    and the map already shows its new bytes."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _forget_inherited_envs() -> None:
    # In a forked child the parent's handles are unusable. Each is closed when the child opens
    # its path (py-lmdb refuses a file open twice), not here, where a close that waited would
    # hang the child before any stack could be asked of it (mmloader.loading.stalled).
    global _ENVS_LOCK
    _ENVS_LOCK = threading.Lock()  # another thread may have held it at the fork
    _INHERITED.update(_ENVS)
    _ENVS.clear()
    _ENV_FILES.clear()
    forget_trimmers()


def _close_inherited(path: str) -> None:
    """Close the environment of ``path`` inherited at fork(), if any, before opening it."""
    inherited = _INHERITED.pop(path, None)
    if inherited is not None:
        with contextlib.suppress(Exception):
            inherited[0].close()


os.register_at_fork(after_in_child=_forget_inherited_envs)


# LMDB's file header (lmdb.h/mdb.c, 64-bit builds): two meta pages, at 0 and at the page size.
# Each is a 16-byte page header (mp_flags u16 at +10, P_META = 0x08) then MDB_meta: mm_magic u32
# at +16, mm_version u32 at +20, mm_address at +24, mm_mapsize at +32, two 48-byte MDB_db records
# from +40 (the free-list db's first u32, md_pad, holds the page size), mm_last_pg u64 at +136,
# mm_txnid u64 at +144. LMDB uses the meta with the larger txnid and maps pages 0..last_pg.
LMDB_MAGIC = 0xBEEFC0DE
_META_END = 152
_PSIZE_RANGE = (512, 1 << 16)


def lmdb_required_size(read, size: int, where: str) -> int:
    """Check an LMDB ``data.mdb`` of ``size`` bytes by its two meta pages, read through
    ``read(offset, n) -> bytes`` (two small reads); return the bytes its newest meta needs.

    A file shorter than that would be memory-mapped and crash the process (SIGBUS) on the first
    page past its end, so this is called before LMDB opens anything. FormatError naming
    ``where`` for a file too small to hold its meta pages, a bad magic or page size, or a
    truncated file.
    """
    if size < _META_END:
        raise FormatError(f"{where}: not an LMDB data file: {size} bytes, too small to hold LMDB's meta pages")
    first = read(0, _META_END)
    if len(first) < _META_END or struct.unpack_from("<I", first, 16)[0] != LMDB_MAGIC:
        raise FormatError(f"{where}: not an LMDB data file (bad magic in its first meta page)")
    psize = struct.unpack_from("<I", first, 40)[0]
    if not (_PSIZE_RANGE[0] <= psize <= _PSIZE_RANGE[1] and psize & (psize - 1) == 0):
        raise FormatError(f"{where}: not an LMDB data file (page size {psize} in its first meta page)")
    if size < psize + _META_END:
        raise FormatError(f"{where}: truncated: {size} bytes, its metadata needs at least {2 * psize} (two meta pages)")
    second = read(psize, _META_END)
    if len(second) < _META_END or struct.unpack_from("<I", second, 16)[0] != LMDB_MAGIC:
        raise FormatError(f"{where}: not an LMDB data file (bad magic in its second meta page)")
    metas = [struct.unpack_from("<QQ", m, 136) for m in (first, second)]  # (last_pg, txnid)
    last_pg, _txnid = max(metas, key=lambda m: m[1])
    need = max((last_pg + 1) * psize, 2 * psize)
    if size < need:
        raise FormatError(f"{where}: truncated: {size} bytes, its metadata needs at least {need}")
    return need


def check_lmdb_file(data_mdb: str | os.PathLike, where: str | None = None) -> None:
    """:func:`lmdb_required_size` on a local ``data.mdb`` (errors name ``where``, default the file)."""
    data_mdb = os.fspath(data_mdb)
    with open(data_mdb, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        lmdb_required_size(lambda offset, n: os.pread(f.fileno(), n, offset), size, where or data_mdb)


def shared_env(path: str) -> tuple[lmdb.Environment, dict]:
    """This process's read-only environment for ``path`` and its sub-database handles.

    Every sub-database is opened here, once, in committed transactions: a handle
    opened inside a long-lived read transaction would stay private to it, and
    each thread reads through its own transaction.
    """
    # A dataset written again under the same name (overwrite=True) is a new data.mdb: the
    # environment mapped for the old file would go on serving the old bytes in this process.
    file_id = _file_id(os.path.join(path, "data.mdb"))
    hit = _ENVS.get(path)
    if hit is None or _ENV_FILES.get(path) != file_id:
        with FORK_GATE.hold(), _ENVS_LOCK:
            hit = _ENVS.get(path)
            if hit is None or _ENV_FILES.get(path) != file_id:
                if not os.path.isfile(os.path.join(path, "data.mdb")):
                    raise FormatError(f"{path} is not an LMDB environment (no data.mdb)")
                try:
                    check_lmdb_file(os.path.join(path, "data.mdb"))  # a short file would crash the map
                except OSError:
                    pass  # unreadable: lmdb.open below reports it, naming the environment
                # lock=False: datasets are frozen once written, so no reader table (no slot
                # exhaustion with many workers); readahead off: random access pays no extra IO.
                # The data file itself is opened (subdir=False): py-lmdb refuses an environment
                # whose files are those of one open in this process, and of a folder it counts
                # lock.mdb too, which a reader without locks never holds open. A dataset written
                # again beside the old lock.mdb (or whose new file takes the inode of the old,
                # deleted lock.mdb) would be refused while the old environment is still open;
                # the old data.mdb, held open by its environment, can never be the new file.
                _close_inherited(path)
                env = lmdb.open(
                    os.path.join(path, "data.mdb"),
                    readonly=True,
                    lock=False,
                    readahead=False,
                    max_dbs=MAX_DBS,
                    subdir=False,
                )
                with env.begin(buffers=True) as txn:  # views: an address inside the map, for the trimmer
                    records = [(bytes(k), v) for k, v in txn.cursor()]  # the main database lists the named ones
                    names = [k for k, _v in records]
                    inside = next((np.frombuffer(v, np.uint8).ctypes.data for _k, v in records if len(v)), None)
                dbs = {}
                for name in names:
                    try:
                        dbs[name] = env.open_db(name, create=False)
                    except lmdb.Error:
                        pass  # a plain key in the main database, not a sub-database
                hit = _ENVS[path] = (env, dbs)
                _ENV_FILES[path] = file_id
                MapTrimmer.start(path, os.path.join(path, "data.mdb"), inside)
    return hit


class LMDBStore(Store):
    """Random access to an mmloader LMDB dataset. Opens nothing until first use.

    >>> ds = LMDBStore("data.lmdb")           # doctest: +SKIP
    >>> len(ds), ds.fields, ds[0]["__key__"]    # doctest: +SKIP
    """

    format = "lmdb"

    def __init__(self, path: str | os.PathLike):
        self.path = str(Path(path).resolve())
        self._meta: dict | None = None
        self._pid = -1
        self._local = threading.local()  # one long-lived read transaction per thread
        self._dbs: dict[bytes, Any] = {}

    def __getstate__(self) -> dict:
        return {"path": self.path, "_meta": self._meta}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["path"])
        self._meta = state["_meta"]

    def _handles(self, views: bool = False):
        pid = os.getpid()
        if self._pid != pid:
            (self._env, self._dbs), self._pid = shared_env(self.path), pid
        local = self._local
        if getattr(local, "pid", None) != pid:
            with FORK_GATE.hold():
                local.txn, local.view_txn, local.pid = self._env.begin(buffers=False), None, pid
        if views:  # values as zero-copy views of the map, valid while this transaction lives
            if local.view_txn is None:
                with FORK_GATE.hold():
                    local.view_txn = self._env.begin(buffers=True)
            return local.view_txn
        return local.txn

    def _field_dbs(self, fields: Sequence[str]) -> list:
        """The sub-database of each field, every name checked against the metadata first."""
        for f in fields:
            if f not in self.metadata["field_counts"]:
                raise KeyError(f"{self.path} has no field {f!r} (fields: {self.fields})")
        return [self._db(f.encode()) for f in fields]

    def _db(self, name: bytes):
        self._handles()
        db = self._dbs.get(name)
        if db is None:
            raise FormatError(f"{self.path}: no sub-database {name.decode()!r}; is this an mmloader LMDB dataset?")
        return db

    @property
    def metadata(self) -> dict:
        if self._meta is None:
            txn = self._handles()
            try:
                with FORK_GATE.hold():
                    raw = txn.get(b"meta", db=self._db(META_DB))
            except FormatError:
                raw = None
            if raw is None:
                raise FormatError(
                    f"{self.path} is an LMDB environment but not an mmloader dataset "
                    "(no __meta__ record); convert it with `mmloader convert`"
                )
            meta = json.loads(raw)
            if meta.get("format") != LMDB_FORMAT:
                raise FormatError(f"{self.path}: unknown format {meta.get('format')!r}")
            self._meta = meta
        return self._meta

    def __len__(self) -> int:
        return int(self.metadata["count"])

    def key(self, index: int) -> str:
        i = self._check_index(index)
        with FORK_GATE.hold():
            raw = self._handles().get(INDEX_KEY.pack(i), db=self._db(KEYS_DB))
        if raw is None:
            raise SampleError(f"index {i} has no key record", where=self.path)
        return raw.decode("utf-8")

    def key_digest(self) -> str:
        """:meth:`KeysView.fingerprint`, read with one cursor over the key records (index order)."""
        h = key_hasher(len(self))
        with self._handles().cursor(db=self._db(KEYS_DB)) as cur:
            for _k, v in _gated(cur):
                h.update(b"\0" + bytes(v))
        return h.hexdigest()

    def index_of(self, key: str) -> int | None:
        with FORK_GATE.hold():
            raw = self._handles().get(key.encode("utf-8"), db=self._db(INDEX_DB))
        return None if raw is None else INDEX_KEY.unpack(raw)[0]

    def read(self, index: int, fields: Sequence[str] | None = None) -> dict[str, Any]:
        i = self._check_index(index)
        txn = self._handles()
        fields = self.fields if fields is None else fields
        dbs = self._field_dbs(fields)
        maybe_trim(len(fields) + 1)
        k = INDEX_KEY.pack(i)
        with FORK_GATE.hold():
            out: dict[str, Any] = {"__key__": txn.get(k, None, self._db(KEYS_DB)).decode("utf-8"), "__index__": i}
            for f, db in zip(fields, dbs):
                v = txn.get(k, None, db)
                if v is not None:
                    out[f] = v
        return out

    def read_many(self, indices, fields, views: bool = False):
        """``views``: values are zero-copy memoryviews of the memory map (valid while this
        thread's read transaction lives, i.e. to be consumed before the thread ends)."""
        txn = self._handles()
        dbs = self._field_dbs(fields)
        keys_db, pack, get = self._db(KEYS_DB), INDEX_KEY.pack, txn.get
        maybe_trim(len(indices) * (len(fields) + 1))
        ks = list(map(pack, self._check_indices(indices)))
        vget = self._handles(views=True).get if views else get
        with FORK_GATE.hold():
            # (key, default, db) passed by position: py-lmdb parses keywords at ~0.2 us a call,
            # and a sample is three calls
            keys = [get(k, None, keys_db).decode("utf-8") for k in ks]
            columns = {f: [vget(k, None, db) for k in ks] for f, db in zip(fields, dbs)}
        return keys, columns

    def field_values(self, indices: Sequence[int], field: str) -> list:
        """A run of consecutive indices is read with one cursor walk (no key table, no lookup per
        value: ~0.1 us a value instead of ~1); any other list value by value."""
        a = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(a)
        run = n > 0 and a[0] >= 0 and a[-1] < len(self) and bool((np.diff(a) == 1).all())
        idx = a.tolist() if run else self._check_indices(a.tolist())
        db, txn, pack = self._db(field.encode()), self._handles(), INDEX_KEY.pack
        maybe_trim(n)
        with FORK_GATE.hold():
            if not run:
                return [txn.get(pack(i), None, db) for i in idx]
            with txn.cursor(db=db) as cur:
                if cur.set_key(pack(idx[0])):  # every value there (the usual case): n in a row
                    values = list(itertools.islice(cur.iternext(keys=False, values=True), n))
                    if len(values) == n and cur.key() == pack(idx[-1]):
                        return values
                out: list = [None] * n  # some absent: place each by its key
                stop = pack(idx[0] + n)
                if cur.set_range(pack(idx[0])):
                    for key, value in cur:
                        if key >= stop:
                            break
                        out[INDEX_KEY.unpack(key)[0] - idx[0]] = value
        return out

    def field_size(self, index: int, field: str) -> int:
        return int(self.field_sizes([self._check_index(index)], field)[0])

    def field_sizes(self, indices: Sequence[int], field: str) -> np.ndarray:
        db = self._db(field.encode())
        get, pack = self._handles(views=True).get, INDEX_KEY.pack  # views: sizes without copying values
        out = np.zeros(len(indices), dtype=np.int64)
        maybe_trim(len(indices))  # sizes come from B-tree leaves, whose faults map pages too
        with FORK_GATE.hold():
            for j, i in enumerate(self._check_indices(indices)):
                v = get(pack(i), None, db)
                out[j] = 0 if v is None else len(v)
        return out

    # -- the records as stored, for integrity checks (``mmloader verify``) -----------------------
    def key_records(self) -> Iterator[tuple[int, bytes, int | None]]:
        """The key table as stored, in order: ``(index, key bytes, index the key maps back to)``;
        index -1 for a record whose key is not an 8-byte index, back None for a key that maps nowhere.

        >>> [i for i, key, back in store.key_records() if back != i]    # doctest: +SKIP
        []
        """
        txn = self._handles()
        index_db = self._db(INDEX_DB)
        with txn.cursor(db=self._db(KEYS_DB)) as cur:
            for k, v in _gated(cur):
                with FORK_GATE.hold():
                    back = txn.get(v, db=index_db)
                yield (
                    INDEX_KEY.unpack(k)[0] if len(k) == 8 else -1,
                    bytes(v),
                    INDEX_KEY.unpack(back)[0] if back is not None and len(back) == 8 else None,
                )

    def field_records(self, field: str) -> Iterator[tuple[int, bytes]]:
        """Every stored value of ``field`` in index order: ``(index, bytes)`` (index -1 when malformed)."""
        with self._handles().cursor(db=self._db(field.encode())) as cur:
            for k, v in _gated(cur):
                yield (INDEX_KEY.unpack(k)[0] if len(k) == 8 else -1), v


_END = object()


def _gated(cursor) -> Iterator:
    """A cursor's records, each step taken inside the fork gate (never held across a yield:
    the consumer of a generator may fork)."""
    records = iter(cursor)
    while True:
        with FORK_GATE.hold():
            record = next(records, _END)
        if record is _END:
            return
        yield record


class LMDBWriter(AtomicWriter):
    """Write samples into a new LMDB dataset, atomically.

    Commits every ``commit_every`` samples, doubles ``map_size`` when LMDB reports
    it full, and renames the finished environment into place on :meth:`close`.

    >>> with LMDBWriter("out.lmdb") as w:                           # doctest: +SKIP
    ...     w.write({"__key__": "0001", "jpg": jpeg_bytes, "txt": "a cat"})
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        map_size: int = 1 << 30,
        commit_every: int = 1000,
        metadata: Mapping | None = None,
    ):
        self._dir = AtomicDirectory(path, overwrite=overwrite)
        self.path = self._dir.final
        self.user_metadata = dict(metadata or {})
        self.commit_every = commit_every
        self.stats = FieldStats()
        self.count = 0
        # meminit stays on: LMDB zeroes the unused part of each new page, else whatever the heap
        # held before (other data, credentials) ends up in a file that is handed to strangers
        self._env = lmdb.open(
            str(self._dir.tmp),
            map_size=map_size,
            max_dbs=MAX_DBS,
            subdir=True,
            sync=False,
            metasync=False,
            writemap=False,
        )
        self._dbs = {n: self._env.open_db(n) for n in (KEYS_DB, INDEX_DB, META_DB)}
        self._txn = self._env.begin(write=True)
        self._pending: list[tuple[int, bytes, dict[str, bytes]]] = []

    def write(self, sample: Mapping[str, Any]) -> int:
        """Append one sample (``{"__key__": str, field: value, ...}``); returns its index."""
        key, fields = split_sample(dict(sample))
        validate_key(key)
        for f in fields:
            if f.encode() not in self._dbs:
                validate_field(f)
                self._commit()  # open_db needs its own write transaction
                self._txn.abort()
                self._dbs[f.encode()] = self._env.open_db(f.encode())
                self._txn = self._env.begin(write=True)
        item = (self.count, key.encode("utf-8"), fields)
        self._put_growing(item)
        self._pending.append(item)
        self.stats.add(fields)
        self.count += 1
        if len(self._pending) >= self.commit_every:
            self._commit()
        return item[0]

    def _put(self, item) -> None:
        index, key, fields = item
        k = INDEX_KEY.pack(index)
        if not self._txn.put(key, k, db=self._dbs[INDEX_DB], overwrite=False):
            raise DuplicateKeyError(f"duplicate sample key {key.decode()!r} (index {index}) while writing {self.path}")
        self._txn.put(k, key, db=self._dbs[KEYS_DB], append=True)
        for f, v in fields.items():
            self._txn.put(k, v, db=self._dbs[f.encode()], append=True)

    def _with_room(self, write) -> None:
        """Run ``write()`` in the open transaction; when LMDB reports the map full, abort,
        double the map, replay the uncommitted chunk and try again."""
        while True:
            try:
                write()
                return
            except lmdb.MapFullError:
                self._txn.abort()
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
                self._txn = self._env.begin(write=True)
                for done in self._pending:
                    self._put(done)

    def _put_growing(self, item) -> None:
        self._with_room(lambda: self._put(item))

    def _commit(self) -> None:
        self._txn.commit()
        self._pending.clear()
        self._txn = self._env.begin(write=True)

    def close(self) -> Path:
        """Write the metadata record, sync, and rename the dataset into place."""
        meta = make_metadata(LMDB_FORMAT, self.count, self.stats, self.user_metadata)
        item_meta = json.dumps(meta, ensure_ascii=False).encode()

        def finish() -> None:  # retried as a whole (with the chunk replayed) if the map fills up
            self._txn.put(b"meta", item_meta, db=self._dbs[META_DB])
            self._txn.commit()

        self._with_room(finish)
        self._pending.clear()
        self._env.sync(True)
        self._env.close()
        return self._dir.commit()

    def abort(self) -> None:
        try:
            self._txn.abort()
            self._env.close()
        finally:
            self._dir.abort()
