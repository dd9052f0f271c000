"""Real PostgreSQL drivers against redoubt's SQL gateway (run by tests/sql_drivers.rs).

Each check prints `ok NAME` or `FAIL NAME: error`; the script exits 1 if any failed.
"""
import datetime
import decimal
import logging
import os
import sys
import traceback
import uuid

HOST = os.environ["GW_HOST"]
PORT = int(os.environ["GW_PORT"])
DSN = f"host={HOST} port={PORT} user=tester dbname=redoubt connect_timeout=10"
FAILED = []

TS = datetime.datetime(2024, 2, 29, 12, 30, 5, 250000)
TSZ = datetime.datetime(2024, 2, 29, 12, 30, 5, tzinfo=datetime.timezone.utc)
DAY = datetime.date(2024, 3, 1)
UID = uuid.UUID("4f1b2c3d-0000-4000-8000-000000000001")


def check(f):
    try:
        f()
        print(f"ok {f.__name__}", flush=True)
    except Exception as e:  # noqa: BLE001 - report every failure, go on
        FAILED.append(f.__name__)
        print(f"FAIL {f.__name__}: {e!r}", flush=True)
        traceback.print_exc()
    return f


@check
def psycopg2_binds_datetime_date_bytes_uuid_decimal():
    import psycopg2
    import psycopg2.extras

    psycopg2.extras.register_uuid()
    c = psycopg2.connect(DSN)
    c.autocommit = True
    cur = c.cursor()
    cur.execute(
        "CREATE TABLE p2 (id SERIAL PRIMARY KEY, ts TIMESTAMP, tz TIMESTAMPTZ, d DATE, "
        "b BYTEA, u UUID, n NUMERIC, t TEXT)"
    )
    cur.execute(
        "INSERT INTO p2 (ts, tz, d, b, u, n, t) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (TS, TSZ, DAY, psycopg2.Binary(b"\x00\xff'\\x"), UID, decimal.Decimal("12.50"), "it's"),
    )
    assert cur.fetchone()[0] == 1
    cur.execute("INSERT INTO p2 (t) VALUES (%s) RETURNING id", ("second",))
    assert cur.fetchone()[0] == 2, "SERIAL ids count up"
    cur.execute("SELECT ts, tz, d, b, u, n, t FROM p2 WHERE id = %s", (1,))
    ts, tz, d, b, u, n, t = cur.fetchone()
    assert ts == "2024-02-29 12:30:05.250000", ts
    assert tz == "2024-02-29 12:30:05+00:00", tz
    assert d == "2024-03-01", d
    assert bytes(b) == b"\x00\xff'\\x", b
    assert u == str(UID), u
    assert decimal.Decimal(str(n)) == decimal.Decimal("12.50"), n
    assert t == "it's", t
    # Comparisons with bound values find the row.
    cur.execute("SELECT id FROM p2 WHERE d = %s AND u = %s AND ts < %s", (DAY, UID, TS + datetime.timedelta(1)))
    assert cur.fetchall() == [(1,)]
    cur.execute("SELECT count(*) FROM p2")
    (count,) = cur.fetchone()
    assert count == 2 and isinstance(count, int), repr(count)
    cur.execute("SELECT %s::int + 1, '7'::bigint, 2.5::float8", (41,))
    assert cur.fetchone() == (42, 7, 2.5)
    # Lists become ARRAY[...]: refused with 0A000, not a syntax error.
    try:
        cur.execute("SELECT %s", ([1, 2],))
        raise AssertionError("a list was accepted")
    except psycopg2.Error as e:
        assert e.pgcode == "0A000", (e.pgcode, str(e))
    c.close()


@check
def psycopg2_sql_functions_and_ilike():
    import psycopg2

    c = psycopg2.connect(DSN)
    c.autocommit = True
    cur = c.cursor()
    cur.execute("SELECT now(), version(), 'Hello' ILIKE 'hELLO', 'x' NOT ILIKE 'X'")
    now, version, ilike, not_ilike = cur.fetchone()
    parsed = datetime.datetime.fromisoformat(now.replace("+00:00", ""))
    assert abs((parsed - datetime.datetime.utcnow()).total_seconds()) < 600, now
    assert version.startswith("PostgreSQL "), version
    assert ilike == 1 and not_ilike == 0, (ilike, not_ilike)
    c.close()


@check
def psycopg3_binary_parameters_and_int_results():
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute(
            "CREATE TABLE p3 (id INTEGER PRIMARY KEY, ts TIMESTAMP, tz TIMESTAMPTZ, d DATE, "
            "u UUID, b BYTEA, f FLOAT8, ok BOOLEAN, n INT)"
        )
        c.execute(
            "INSERT INTO p3 (id, ts, tz, d, u, b, f, ok, n) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (1, TS, TSZ, DAY, UID, b"\x01\x02", 1.5, True, 7),
        )
        row = c.execute("SELECT ts, tz, d, u, b, f, ok, n FROM p3 WHERE id = %s", (1,)).fetchone()
        assert row == (
            "2024-02-29 12:30:05.25",
            "2024-02-29 12:30:05+00:00",
            "2024-03-01",
            str(UID),
            b"\x01\x02",
            1.5,
            True,
            7,
        ), row
        found = c.execute("SELECT id FROM p3 WHERE d = %s AND u = %s", (DAY, UID)).fetchall()
        assert found == [(1,)], found
        (count,) = c.execute("SELECT count(*) FROM p3 WHERE n > %s", (0,)).fetchone()
        assert count == 1 and isinstance(count, int), repr(count)
        (total,) = c.execute("SELECT sum(f) * 2 FROM p3").fetchone()
        assert total == 3.0 and isinstance(total, float), repr(total)
        (x,) = c.execute("SELECT %s::int * 2", (21,)).fetchone()
        assert x == 42, x
        # Binary results too.
        cur = c.cursor(binary=True)
        cur.execute("SELECT count(*), max(n) FROM p3")
        assert cur.fetchone() == (1, 7)


@check
def psycopg3_transaction_after_a_query_and_savepoints():
    import psycopg

    with psycopg.connect(DSN) as c:  # not autocommit: the first query opens a block
        c.execute("SELECT count(*) FROM p3").fetchone()
        with c.transaction():  # a SAVEPOINT inside the open block
            c.execute("INSERT INTO p3 (id, n) VALUES (%s, %s)", (2, 8))
        try:
            with c.transaction():
                c.execute("INSERT INTO p3 (id, n) VALUES (%s, %s)", (3, 9))
                raise RuntimeError("undo this savepoint")
        except RuntimeError:
            pass
        try:
            with c.transaction():
                c.execute("INSERT INTO p3 (id, n) VALUES (%s, %s)", (2, 10))  # duplicate key
        except psycopg.errors.UniqueViolation:
            pass
        ids = [r[0] for r in c.execute("SELECT id FROM p3 ORDER BY id")]
        assert ids == [1, 2], ids
        c.commit()
    with psycopg.connect(DSN, autocommit=True) as c:
        ids = [r[0] for r in c.execute("SELECT id FROM p3 ORDER BY id")]
        assert ids == [1, 2], ids
        with c.transaction():  # BEGIN ... COMMIT
            c.execute("UPDATE p3 SET n = n + 1 WHERE id = %s", (2,))
        assert c.execute("SELECT n FROM p3 WHERE id = 2").fetchone() == (9,)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


@check
def psycopg3_prepared_statements_and_rollback_without_warnings():
    import psycopg

    records = Records()
    logging.getLogger("psycopg").addHandler(records)
    with psycopg.connect(DSN) as c:
        for i in range(8):  # prepared on the server after 5 executions
            (n,) = c.execute("SELECT n FROM p3 WHERE id = %s", (1,)).fetchone()
            assert n == 7, n
        c.rollback()
        for i in range(8):
            c.execute("SELECT n FROM p3 WHERE id = %s", (2,)).fetchone()
        c.rollback()
        c.execute("DEALLOCATE ALL")
        c.rollback()
    assert records.records == [], records.records


@check
def sqlalchemy_core():
    import sqlalchemy as sa

    eng = sa.create_engine(f"postgresql+psycopg2://tester@{HOST}:{PORT}/redoubt")
    md = sa.MetaData()
    users = sa.Table(
        "sa_users",
        md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(50), nullable=False),
        sa.Column("born", sa.Date),
    )
    md.create_all(eng)
    md.create_all(eng)  # has_table finds it: nothing to do
    with eng.begin() as conn:
        conn.execute(users.insert(), [{"name": "ann", "born": DAY}, {"name": "bob", "born": None}])
    with eng.connect() as conn:
        rows = conn.execute(sa.select(users.c.id, users.c.name).order_by(users.c.id)).all()
        assert [tuple(r) for r in rows] == [(1, "ann"), (2, "bob")], rows
        n = conn.execute(sa.select(sa.func.count()).select_from(users)).scalar()
        assert n == 2, n
        got = conn.execute(sa.select(users.c.name).where(users.c.name.ilike("ANN"))).scalar()
        assert got == "ann", got
    eng.dispose()


@check
def sqlalchemy_orm():
    import sqlalchemy as sa
    from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

    class Base(DeclarativeBase):
        pass

    class Note(Base):
        __tablename__ = "sa_notes"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str] = mapped_column(sa.String(100))

    eng = sa.create_engine(f"postgresql+psycopg2://tester@{HOST}:{PORT}/redoubt")
    Base.metadata.create_all(eng)
    with Session(eng) as s:
        s.add(Note(body="first"))
        s.commit()
        s.add_all([Note(body="second"), Note(body="third")])
        s.commit()
        notes = s.scalars(sa.select(Note).order_by(Note.id)).all()
        assert [(n.id, n.body) for n in notes] == [(1, "first"), (2, "second"), (3, "third")]
        notes[0].body = "changed"
        s.commit()
        assert s.get(Note, 1).body == "changed"
    eng.dispose()


print(f"{len(FAILED)} failed: {FAILED}" if FAILED else "all passed", flush=True)
sys.exit(1 if FAILED else 0)
