//! The file system's tables and the operations on them. Every function runs inside the
//! transaction the service opened; an `Err` rolls the whole operation back.
//!
//! ```text
//! inodes (ino, kind, mode, nlink, uid, gid, size, atime, mtime, ctime, target)
//! dirents (parent, name, ino)            one row per name; "." and ".." are not stored
//! blocks (ino, idx, data)                BLOCK-byte blocks; a missing block reads as zeros
//! ```

use super::op::*;
use rusqlite::{params, Connection, OptionalExtension};

type Res<T> = Result<T, Errno>;

const SCHEMA: &str = "\
    CREATE TABLE IF NOT EXISTS inodes (ino INTEGER PRIMARY KEY, kind INTEGER NOT NULL, \
        mode INTEGER NOT NULL, nlink INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL, \
        size INTEGER NOT NULL, atime INTEGER NOT NULL, mtime INTEGER NOT NULL, \
        ctime INTEGER NOT NULL, target TEXT); \
    CREATE TABLE IF NOT EXISTS dirents (parent INTEGER NOT NULL, name TEXT NOT NULL, \
        ino INTEGER NOT NULL, PRIMARY KEY (parent, name)) WITHOUT ROWID; \
    CREATE TABLE IF NOT EXISTS blocks (ino INTEGER NOT NULL, idx INTEGER NOT NULL, \
        data BLOB NOT NULL, PRIMARY KEY (ino, idx)) WITHOUT ROWID; \
    INSERT OR IGNORE INTO inodes VALUES (1, 1, 493, 2, 0, 0, 0, 0, 0, 0, NULL);";

/// Any SQLite failure: a full state is the one a client can act on.
fn db(e: rusqlite::Error) -> Errno {
    Errno::from(e)
}

impl From<rusqlite::Error> for Errno {
    fn from(e: rusqlite::Error) -> Errno {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => Errno::NoSpace,
            _ => Errno::Io,
        }
    }
}

fn kind_code(k: Kind) -> i64 {
    match k {
        Kind::File => 0,
        Kind::Dir => 1,
        Kind::Symlink => 2,
    }
}

fn kind_of(code: i64) -> Kind {
    match code {
        1 => Kind::Dir,
        2 => Kind::Symlink,
        _ => Kind::File,
    }
}

/// Creates the tables unless `ready` says the state holds them.
fn ensure_schema(c: &Connection, ready: bool) -> Res<()> {
    if ready {
        return Ok(());
    }
    c.execute_batch(SCHEMA).map_err(db)
}

/// Whether the state holds the file system's tables.
pub(super) fn schema_present(c: &Connection) -> bool {
    c.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'blocks'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .is_ok_and(|n| n == 1)
}

fn attr(c: &Connection, ino: Ino) -> Res<Attr> {
    c.prepare_cached(
        "SELECT kind, mode, nlink, uid, gid, size, atime, mtime, ctime FROM inodes WHERE ino = ?1",
    )
    .map_err(db)?
    .query_row([ino as i64], |r| {
        Ok(Attr {
            ino,
            kind: kind_of(r.get(0)?),
            mode: r.get::<_, i64>(1)? as u32,
            nlink: r.get::<_, i64>(2)? as u32,
            uid: r.get::<_, i64>(3)? as u32,
            gid: r.get::<_, i64>(4)? as u32,
            size: r.get::<_, i64>(5)? as u64,
            atime_ms: r.get::<_, i64>(6)? as u64,
            mtime_ms: r.get::<_, i64>(7)? as u64,
            ctime_ms: r.get::<_, i64>(8)? as u64,
        })
    })
    .optional()
    .map_err(db)?
    .ok_or(Errno::NoEnt)
}

fn entry(c: &Connection, parent: Ino, name: &str) -> Res<Option<Ino>> {
    c.prepare_cached("SELECT ino FROM dirents WHERE parent = ?1 AND name = ?2")
        .map_err(db)?
        .query_row(params![parent as i64, name], |r| r.get::<_, i64>(0))
        .optional()
        .map(|o| o.map(|i| i as u64))
        .map_err(db)
}

fn dir(c: &Connection, ino: Ino) -> Res<Attr> {
    let a = attr(c, ino)?;
    if a.kind != Kind::Dir {
        return Err(Errno::NotDir);
    }
    Ok(a)
}

fn check_name(name: &str) -> Res<()> {
    if name.len() > NAME_BYTES_MAX {
        return Err(Errno::NameTooLong);
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Errno::Inval);
    }
    Ok(())
}

fn set_times(c: &Connection, ino: Ino, mtime: bool, now: u64) -> Res<()> {
    let sql = if mtime {
        "UPDATE inodes SET mtime = ?2, ctime = ?2 WHERE ino = ?1"
    } else {
        "UPDATE inodes SET ctime = ?2 WHERE ino = ?1"
    };
    c.prepare_cached(sql)
        .map_err(db)?
        .execute(params![ino as i64, now as i64])
        .map_err(db)?;
    Ok(())
}

fn add_nlink(c: &Connection, ino: Ino, delta: i64) -> Res<()> {
    c.prepare_cached("UPDATE inodes SET nlink = nlink + ?2 WHERE ino = ?1")
        .map_err(db)?
        .execute(params![ino as i64, delta])
        .map_err(db)?;
    Ok(())
}

/// A new inode named `name` in `parent` (which must not hold the name).
#[allow(clippy::too_many_arguments)]
fn make(
    c: &Connection,
    parent: Ino,
    name: &str,
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
    target: Option<&str>,
    now: u64,
) -> Res<Attr> {
    check_name(name)?;
    dir(c, parent)?;
    if entry(c, parent, name)?.is_some() {
        return Err(Errno::Exist);
    }
    let nlink = if kind == Kind::Dir { 2 } else { 1 };
    let size = target.map_or(0, |t| t.len() as i64);
    c.prepare_cached(
        "INSERT INTO inodes (kind, mode, nlink, uid, gid, size, atime, mtime, ctime, target) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?7, ?8)",
    )
    .map_err(db)?
    .execute(params![
        kind_code(kind),
        (mode & 0o7777) as i64,
        nlink,
        uid as i64,
        gid as i64,
        size,
        now as i64,
        target
    ])
    .map_err(db)?;
    let ino = c.last_insert_rowid() as u64;
    link_name(c, parent, name, ino)?;
    if kind == Kind::Dir {
        add_nlink(c, parent, 1)?;
    }
    set_times(c, parent, true, now)?;
    attr(c, ino)
}

fn link_name(c: &Connection, parent: Ino, name: &str, ino: Ino) -> Res<()> {
    c.prepare_cached("INSERT INTO dirents VALUES (?1, ?2, ?3)")
        .map_err(db)?
        .execute(params![parent as i64, name, ino as i64])
        .map_err(db)?;
    Ok(())
}

fn unlink_name(c: &Connection, parent: Ino, name: &str) -> Res<()> {
    c.prepare_cached("DELETE FROM dirents WHERE parent = ?1 AND name = ?2")
        .map_err(db)?
        .execute(params![parent as i64, name])
        .map_err(db)?;
    Ok(())
}

/// Drops one link to `ino`; the inode and its blocks go with its last.
fn drop_link(c: &Connection, ino: Ino, now: u64) -> Res<()> {
    let a = attr(c, ino)?;
    if a.nlink <= 1 || a.kind == Kind::Dir {
        for sql in [
            "DELETE FROM blocks WHERE ino = ?1",
            "DELETE FROM inodes WHERE ino = ?1",
        ] {
            c.prepare_cached(sql)
                .map_err(db)?
                .execute([ino as i64])
                .map_err(db)?;
        }
        return Ok(());
    }
    add_nlink(c, ino, -1)?;
    set_times(c, ino, false, now)
}

fn is_empty_dir(c: &Connection, ino: Ino) -> Res<bool> {
    c.prepare_cached("SELECT 1 FROM dirents WHERE parent = ?1 LIMIT 1")
        .map_err(db)?
        .query_row([ino as i64], |_| Ok(()))
        .optional()
        .map(|o| o.is_none())
        .map_err(db)
}

/// The parent of directory `ino` (the root is its own parent).
fn parent_of(c: &Connection, ino: Ino) -> Res<Ino> {
    if ino == ROOT {
        return Ok(ROOT);
    }
    c.prepare_cached("SELECT parent FROM dirents WHERE ino = ?1 LIMIT 1")
        .map_err(db)?
        .query_row([ino as i64], |r| r.get::<_, i64>(0))
        .optional()
        .map_err(db)?
        .map(|p| p as u64)
        .ok_or(Errno::NoEnt)
}

fn read_block(c: &Connection, ino: Ino, idx: u64) -> Res<Option<Vec<u8>>> {
    c.prepare_cached("SELECT data FROM blocks WHERE ino = ?1 AND idx = ?2")
        .map_err(db)?
        .query_row(params![ino as i64, idx as i64], |r| r.get::<_, Vec<u8>>(0))
        .optional()
        .map_err(db)
}

fn put_block(c: &Connection, ino: Ino, idx: u64, data: &[u8]) -> Res<()> {
    c.prepare_cached("INSERT OR REPLACE INTO blocks VALUES (?1, ?2, ?3)")
        .map_err(db)?
        .execute(params![ino as i64, idx as i64, data])
        .map_err(db)?;
    Ok(())
}

fn file_data(c: &Connection, a: &Attr, offset: u64, len: u32) -> Res<Vec<u8>> {
    let end = a
        .size
        .min(offset.saturating_add(len.min(IO_BYTES_MAX) as u64));
    if offset >= end {
        return Ok(Vec::new());
    }
    let mut out = vec![0u8; (end - offset) as usize];
    let mut stmt = c
        .prepare_cached("SELECT idx, data FROM blocks WHERE ino = ?1 AND idx BETWEEN ?2 AND ?3")
        .map_err(db)?;
    let rows = stmt
        .query_map(
            params![
                a.ino as i64,
                (offset / BLOCK) as i64,
                ((end - 1) / BLOCK) as i64
            ],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?)),
        )
        .map_err(db)?;
    for row in rows {
        let (idx, data) = row.map_err(db)?;
        let start = idx * BLOCK;
        for (i, b) in data.iter().enumerate() {
            let at = start + i as u64;
            if at >= offset && at < end {
                out[(at - offset) as usize] = *b;
            }
        }
    }
    Ok(out)
}

fn write_data(c: &Connection, a: &Attr, offset: u64, data: &[u8], now: u64) -> Res<Attr> {
    if a.kind == Kind::Dir {
        return Err(Errno::IsDir);
    }
    if a.kind != Kind::File {
        return Err(Errno::Inval);
    }
    if data.len() > IO_BYTES_MAX as usize {
        return Err(Errno::Inval);
    }
    let end = offset.checked_add(data.len() as u64).ok_or(Errno::Inval)?;
    let mut done = 0usize;
    while done < data.len() {
        let at = offset + done as u64;
        let (idx, within) = (at / BLOCK, (at % BLOCK) as usize);
        let n = (BLOCK as usize - within).min(data.len() - done);
        let mut block = read_block(c, a.ino, idx)?.unwrap_or_default();
        if block.len() < within + n {
            block.resize(within + n, 0);
        }
        block[within..within + n].copy_from_slice(&data[done..done + n]);
        put_block(c, a.ino, idx, &block)?;
        done += n;
    }
    c.prepare_cached(
        "UPDATE inodes SET size = max(size, ?2), mtime = ?3, ctime = ?3 WHERE ino = ?1",
    )
    .map_err(db)?
    .execute(params![a.ino as i64, end as i64, now as i64])
    .map_err(db)?;
    attr(c, a.ino)
}

fn truncate(c: &Connection, a: &Attr, size: u64) -> Res<()> {
    if a.kind != Kind::File {
        return Err(if a.kind == Kind::Dir {
            Errno::IsDir
        } else {
            Errno::Inval
        });
    }
    let keep = size.div_ceil(BLOCK);
    c.prepare_cached("DELETE FROM blocks WHERE ino = ?1 AND idx >= ?2")
        .map_err(db)?
        .execute(params![a.ino as i64, keep as i64])
        .map_err(db)?;
    if !size.is_multiple_of(BLOCK) {
        let idx = size / BLOCK;
        if let Some(mut b) = read_block(c, a.ino, idx)? {
            b.truncate((size % BLOCK) as usize);
            put_block(c, a.ino, idx, &b)?;
        }
    }
    c.prepare_cached("UPDATE inodes SET size = ?2 WHERE ino = ?1")
        .map_err(db)?
        .execute(params![a.ino as i64, size as i64])
        .map_err(db)?;
    Ok(())
}

/// A read-only operation.
pub(super) fn read(c: &Connection, op: &FileOp, state_bytes: u64, ready: bool) -> Res<FileReply> {
    ensure_schema(c, ready)?;
    Ok(match op {
        FileOp::Lookup { parent, name } => {
            dir(c, *parent)?;
            let ino = match name.as_str() {
                "." => *parent,
                ".." => parent_of(c, *parent)?,
                n => entry(c, *parent, n)?.ok_or(Errno::NoEnt)?,
            };
            FileReply::Attr(attr(c, ino)?)
        }
        FileOp::GetAttr { ino } => FileReply::Attr(attr(c, *ino)?),
        FileOp::Read { ino, offset, len } => {
            let a = attr(c, *ino)?;
            if a.kind == Kind::Dir {
                return Err(Errno::IsDir);
            }
            FileReply::Data(file_data(c, &a, *offset, *len)?)
        }
        FileOp::ReadDir { ino, after, max } => {
            dir(c, *ino)?;
            let max = (*max).clamp(1, READDIR_MAX);
            let mut stmt = c
                .prepare_cached(
                    "SELECT d.name, d.ino, i.kind FROM dirents d JOIN inodes i ON i.ino = d.ino \
                     WHERE d.parent = ?1 AND d.name > ?2 ORDER BY d.name LIMIT ?3",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(
                    params![*ino as i64, after.as_deref().unwrap_or(""), max as i64 + 1],
                    |r| {
                        Ok(DirEntry {
                            name: r.get(0)?,
                            ino: r.get::<_, i64>(1)? as u64,
                            kind: kind_of(r.get(2)?),
                        })
                    },
                )
                .map_err(db)?;
            let mut entries = rows.collect::<Result<Vec<_>, _>>().map_err(db)?;
            let more = entries.len() > max as usize;
            entries.truncate(max as usize);
            FileReply::Entries { entries, more }
        }
        FileOp::ReadLink { ino } => {
            let target: Option<Option<String>> = c
                .prepare_cached("SELECT target FROM inodes WHERE ino = ?1")
                .map_err(db)?
                .query_row([*ino as i64], |r| r.get(0))
                .optional()
                .map_err(db)?;
            match target {
                None => return Err(Errno::NoEnt),
                Some(None) => return Err(Errno::Inval),
                Some(Some(t)) => FileReply::Target(t),
            }
        }
        FileOp::StatFs => {
            let used: i64 = c
                .query_row(
                    // Pages on the free list are reused for new rows: free space.
                    "SELECT ((SELECT page_count FROM pragma_page_count()) - \
                     (SELECT freelist_count FROM pragma_freelist_count())) * \
                     (SELECT page_size FROM pragma_page_size())",
                    [],
                    |r| r.get(0),
                )
                .map_err(db)?;
            let files: i64 = c
                .query_row("SELECT count(*) FROM inodes", [], |r| r.get(0))
                .map_err(db)?;
            let blocks = state_bytes.saturating_sub(crate::sql::DB_BASE) / BLOCK;
            FileReply::Stats(FsStats {
                blocks,
                blocks_free: blocks.saturating_sub(used as u64 / BLOCK),
                files: files as u64,
            })
        }
        _ => return Err(Errno::Inval),
    })
}

/// An ordered operation at agreed time `now`.
pub(super) fn write(c: &Connection, op: FileOp, now: u64, ready: bool) -> Res<FileReply> {
    ensure_schema(c, ready)?;
    Ok(match op {
        FileOp::Create {
            parent,
            name,
            mode,
            uid,
            gid,
            exclusive,
        } => {
            check_name(&name)?;
            dir(c, parent)?;
            match entry(c, parent, &name)? {
                Some(_) if exclusive => return Err(Errno::Exist),
                Some(ino) => {
                    let a = attr(c, ino)?;
                    if a.kind == Kind::Dir {
                        return Err(Errno::IsDir);
                    }
                    FileReply::Attr(a)
                }
                None => FileReply::Attr(make(
                    c,
                    parent,
                    &name,
                    Kind::File,
                    mode,
                    uid,
                    gid,
                    None,
                    now,
                )?),
            }
        }
        FileOp::Mkdir {
            parent,
            name,
            mode,
            uid,
            gid,
        } => FileReply::Attr(make(
            c,
            parent,
            &name,
            Kind::Dir,
            mode,
            uid,
            gid,
            None,
            now,
        )?),
        FileOp::Symlink {
            parent,
            name,
            target,
            uid,
            gid,
        } => {
            if target.is_empty() || target.len() > TARGET_BYTES_MAX {
                return Err(Errno::NameTooLong);
            }
            FileReply::Attr(make(
                c,
                parent,
                &name,
                Kind::Symlink,
                0o777,
                uid,
                gid,
                Some(&target),
                now,
            )?)
        }
        FileOp::Write { ino, offset, data } => {
            let a = attr(c, ino)?;
            FileReply::Attr(write_data(c, &a, offset, &data, now)?)
        }
        FileOp::SetAttr {
            ino,
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        } => {
            let a = attr(c, ino)?;
            if let Some(s) = size {
                truncate(c, &a, s)?;
            }
            let at = |t: Option<SetTime>, old: u64| match t {
                None => old,
                Some(SetTime::Now) => now,
                Some(SetTime::At(ms)) => ms,
            };
            let new_mtime = if size.is_some() && mtime.is_none() {
                now
            } else {
                at(mtime, a.mtime_ms)
            };
            c.prepare_cached(
                "UPDATE inodes SET mode = ?2, uid = ?3, gid = ?4, atime = ?5, mtime = ?6, \
                 ctime = ?7 WHERE ino = ?1",
            )
            .map_err(db)?
            .execute(params![
                ino as i64,
                (mode.unwrap_or(a.mode) & 0o7777) as i64,
                uid.unwrap_or(a.uid) as i64,
                gid.unwrap_or(a.gid) as i64,
                at(atime, a.atime_ms) as i64,
                new_mtime as i64,
                now as i64
            ])
            .map_err(db)?;
            FileReply::Attr(attr(c, ino)?)
        }
        FileOp::Unlink { parent, name } => {
            dir(c, parent)?;
            let ino = entry(c, parent, &name)?.ok_or(Errno::NoEnt)?;
            if attr(c, ino)?.kind == Kind::Dir {
                return Err(Errno::IsDir);
            }
            unlink_name(c, parent, &name)?;
            drop_link(c, ino, now)?;
            set_times(c, parent, true, now)?;
            FileReply::Done
        }
        FileOp::Rmdir { parent, name } => {
            dir(c, parent)?;
            let ino = entry(c, parent, &name)?.ok_or(Errno::NoEnt)?;
            dir(c, ino)?;
            if !is_empty_dir(c, ino)? {
                return Err(Errno::NotEmpty);
            }
            unlink_name(c, parent, &name)?;
            drop_link(c, ino, now)?;
            add_nlink(c, parent, -1)?;
            set_times(c, parent, true, now)?;
            FileReply::Done
        }
        FileOp::Rename {
            parent,
            name,
            new_parent,
            new_name,
        } => {
            rename(c, parent, &name, new_parent, &new_name, now)?;
            FileReply::Done
        }
        FileOp::Link {
            ino,
            new_parent,
            new_name,
        } => {
            check_name(&new_name)?;
            let a = attr(c, ino)?;
            if a.kind == Kind::Dir {
                return Err(Errno::IsDir);
            }
            if a.nlink >= 65_000 {
                return Err(Errno::MLink);
            }
            dir(c, new_parent)?;
            if entry(c, new_parent, &new_name)?.is_some() {
                return Err(Errno::Exist);
            }
            link_name(c, new_parent, &new_name, ino)?;
            add_nlink(c, ino, 1)?;
            set_times(c, ino, false, now)?;
            set_times(c, new_parent, true, now)?;
            FileReply::Attr(attr(c, ino)?)
        }
        _ => return Err(Errno::Inval),
    })
}

fn rename(c: &Connection, parent: Ino, name: &str, to: Ino, to_name: &str, now: u64) -> Res<()> {
    check_name(to_name)?;
    dir(c, parent)?;
    dir(c, to)?;
    let ino = entry(c, parent, name)?.ok_or(Errno::NoEnt)?;
    let moving = attr(c, ino)?;
    if moving.kind == Kind::Dir {
        // A directory may not move into itself or below itself.
        let mut at = to;
        loop {
            if at == ino {
                return Err(Errno::Inval);
            }
            if at == ROOT {
                break;
            }
            at = parent_of(c, at)?;
        }
    }
    if let Some(old) = entry(c, to, to_name)? {
        if old == ino {
            return Ok(()); // the same file under both names: nothing to do
        }
        let replaced = attr(c, old)?;
        match (moving.kind == Kind::Dir, replaced.kind == Kind::Dir) {
            (true, false) => return Err(Errno::NotDir),
            (false, true) => return Err(Errno::IsDir),
            (true, true) if !is_empty_dir(c, old)? => return Err(Errno::NotEmpty),
            _ => {}
        }
        unlink_name(c, to, to_name)?;
        drop_link(c, old, now)?;
        if replaced.kind == Kind::Dir {
            add_nlink(c, to, -1)?;
        }
    }
    unlink_name(c, parent, name)?;
    link_name(c, to, to_name, ino)?;
    if moving.kind == Kind::Dir && parent != to {
        add_nlink(c, parent, -1)?;
        add_nlink(c, to, 1)?;
    }
    set_times(c, ino, false, now)?;
    set_times(c, parent, true, now)?;
    set_times(c, to, true, now)
}
