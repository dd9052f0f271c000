use super::*;
use redoubt_state::FlatState;

struct Fs {
    svc: FileService,
    state: FlatState,
    seq: u64,
}

impl Fs {
    fn new(mib: u64) -> Fs {
        let state = FlatState::new(mib << 20);
        let mut svc = FileService::new();
        svc.load(&state).unwrap();
        Fs { svc, state, seq: 0 }
    }

    fn op(&mut self, op: FileOp) -> Result<FileReply, Errno> {
        let reply = if op.is_read_only() {
            self.svc
                .execute_read_only(&self.state, &op.encode())
                .unwrap()
        } else {
            self.seq += 1;
            let ctx = ExecContext {
                seq: self.seq,
                client: 1,
                time_ms: 1_000 * self.seq,
                batch_seed: 7,
                index: 0,
            };
            self.svc.execute(&mut self.state, &op.encode(), &ctx)
        };
        match FileReply::decode(&reply).unwrap() {
            FileReply::Error(e) => Err(e),
            r => Ok(r),
        }
    }

    fn attr(&mut self, op: FileOp) -> Result<Attr, Errno> {
        match self.op(op)? {
            FileReply::Attr(a) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    fn mkdir(&mut self, parent: Ino, name: &str) -> Attr {
        self.attr(FileOp::Mkdir {
            parent,
            name: name.into(),
            mode: 0o755,
            uid: 1,
            gid: 1,
        })
        .unwrap()
    }

    fn create(&mut self, parent: Ino, name: &str) -> Result<Attr, Errno> {
        self.attr(FileOp::Create {
            parent,
            name: name.into(),
            mode: 0o644,
            uid: 1,
            gid: 1,
            exclusive: true,
        })
    }

    fn write(&mut self, ino: Ino, offset: u64, data: &[u8]) -> Attr {
        self.attr(FileOp::Write {
            ino,
            offset,
            data: data.to_vec(),
        })
        .unwrap()
    }

    fn read(&mut self, ino: Ino, offset: u64, len: u32) -> Vec<u8> {
        match self.op(FileOp::Read { ino, offset, len }).unwrap() {
            FileReply::Data(d) => d,
            other => panic!("{other:?}"),
        }
    }

    fn lookup(&mut self, parent: Ino, name: &str) -> Result<Attr, Errno> {
        self.attr(FileOp::Lookup {
            parent,
            name: name.into(),
        })
    }

    fn names(&mut self, ino: Ino) -> Vec<String> {
        let (mut out, mut after) = (Vec::new(), None);
        loop {
            match self.op(FileOp::ReadDir { ino, after, max: 2 }).unwrap() {
                FileReply::Entries { entries, more } => {
                    after = entries.last().map(|e| e.name.clone());
                    out.extend(entries.into_iter().map(|e| e.name));
                    if !more {
                        return out;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn files_and_directories_round_trip_across_blocks() {
    let mut fs = Fs::new(4);
    let root = fs.attr(FileOp::GetAttr { ino: ROOT }).unwrap();
    assert_eq!(root.kind, Kind::Dir);
    let d = fs.mkdir(ROOT, "src");
    assert_eq!(fs.attr(FileOp::GetAttr { ino: ROOT }).unwrap().nlink, 3);
    let f = fs.create(d.ino, "main.c").unwrap();
    assert_eq!(fs.create(d.ino, "main.c"), Err(Errno::Exist));
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    fs.write(f.ino, 0, &data[..5000]);
    let a = fs.write(f.ino, 5000, &data[5000..]);
    assert_eq!(a.size, 10_000);
    assert_eq!(a.mtime_ms, 1_000 * fs.seq, "the agreed time of the write");
    assert_eq!(fs.read(f.ino, 0, 20_000), data);
    assert_eq!(fs.read(f.ino, 4090, 20), data[4090..4110].to_vec());
    // A write past the end leaves a hole of zeros.
    fs.write(f.ino, 20_000, b"end");
    let hole = fs.read(f.ino, 9_990, 20);
    assert_eq!(&hole[..10], &data[9_990..]);
    assert_eq!(&hole[10..], &[0u8; 10]);
    // Truncate inside a block, then extend: the cut bytes read as zeros.
    fs.attr(FileOp::SetAttr {
        ino: f.ino,
        mode: Some(0o600),
        uid: None,
        gid: None,
        size: Some(4100),
        atime: None,
        mtime: None,
    })
    .unwrap();
    let a = fs.write(f.ino, 4200, b"x");
    assert_eq!((a.size, a.mode), (4201, 0o600));
    assert_eq!(fs.read(f.ino, 4096, 200)[..4], data[4096..4100]);
    assert_eq!(fs.read(f.ino, 4100, 100), vec![0u8; 100]);
    assert_eq!(fs.lookup(d.ino, "..").unwrap().ino, ROOT);
    assert_eq!(fs.lookup(d.ino, "nothing"), Err(Errno::NoEnt));
}

#[test]
fn names_links_and_renames_keep_the_tree_consistent() {
    let mut fs = Fs::new(4);
    let a = fs.mkdir(ROOT, "a");
    let b = fs.mkdir(a.ino, "b");
    for n in ["z", "y", "x", "w", "v"] {
        fs.create(a.ino, n).unwrap();
    }
    assert_eq!(fs.names(a.ino), ["b", "v", "w", "x", "y", "z"]);
    let z = fs.lookup(a.ino, "z").unwrap();
    let linked = fs
        .attr(FileOp::Link {
            ino: z.ino,
            new_parent: ROOT,
            new_name: "z-link".into(),
        })
        .unwrap();
    assert_eq!(linked.nlink, 2);
    fs.write(z.ino, 0, b"shared");
    let via_link = fs.lookup(ROOT, "z-link").unwrap();
    assert_eq!(fs.read(via_link.ino, 0, 100), b"shared");
    // Rename over an existing file replaces it.
    let rename = |parent, name: &str, new_parent, new_name: &str| FileOp::Rename {
        parent,
        name: name.into(),
        new_parent,
        new_name: new_name.into(),
    };
    fs.op(rename(a.ino, "y", a.ino, "x")).unwrap();
    assert_eq!(fs.names(a.ino), ["b", "v", "w", "x", "z"]);
    // A directory cannot move below itself; onto a non-empty directory neither.
    assert_eq!(fs.op(rename(ROOT, "a", b.ino, "a2")), Err(Errno::Inval));
    fs.mkdir(ROOT, "full");
    let full = fs.lookup(ROOT, "full").unwrap();
    fs.create(full.ino, "f").unwrap();
    assert_eq!(
        fs.op(rename(a.ino, "b", ROOT, "full")),
        Err(Errno::NotEmpty)
    );
    assert_eq!(fs.op(rename(a.ino, "v", ROOT, "full")), Err(Errno::IsDir));
    // Moving b to the root moves its link count with it.
    fs.op(rename(a.ino, "b", ROOT, "b")).unwrap();
    assert_eq!(fs.attr(FileOp::GetAttr { ino: a.ino }).unwrap().nlink, 2);
    assert_eq!(fs.attr(FileOp::GetAttr { ino: ROOT }).unwrap().nlink, 5);
    // Unlink one name: the other still reads; unlink both: the inode is gone.
    fs.op(FileOp::Unlink {
        parent: a.ino,
        name: "z".into(),
    })
    .unwrap();
    assert_eq!(fs.read(via_link.ino, 0, 100), b"shared");
    fs.op(FileOp::Unlink {
        parent: ROOT,
        name: "z-link".into(),
    })
    .unwrap();
    assert_eq!(fs.attr(FileOp::GetAttr { ino: z.ino }), Err(Errno::NoEnt));
    let rmdir = |parent, name: &str| FileOp::Rmdir {
        parent,
        name: name.into(),
    };
    assert_eq!(fs.op(rmdir(ROOT, "full")), Err(Errno::NotEmpty));
    assert_eq!(
        fs.op(FileOp::Unlink {
            parent: ROOT,
            name: "full".into()
        }),
        Err(Errno::IsDir)
    );
    fs.op(rmdir(ROOT, "b")).unwrap();
    let s = fs
        .attr(FileOp::Symlink {
            parent: ROOT,
            name: "to-a".into(),
            target: "a/x".into(),
            uid: 0,
            gid: 0,
        })
        .unwrap();
    assert_eq!(s.kind, Kind::Symlink);
    assert_eq!(
        fs.op(FileOp::ReadLink { ino: s.ino }).unwrap(),
        FileReply::Target("a/x".into())
    );
    assert_eq!(fs.create(ROOT, "bad/name"), Err(Errno::Inval));
    assert_eq!(fs.create(ROOT, &"n".repeat(256)), Err(Errno::NameTooLong));
}

#[test]
fn replicas_agree_and_reads_change_nothing() {
    let mut a = Fs::new(2);
    let mut b = Fs::new(2);
    for fs in [&mut a, &mut b] {
        let d = fs.mkdir(ROOT, "d");
        let f = fs.create(d.ino, "f").unwrap();
        fs.write(f.ino, 100, &[7u8; 9000]);
    }
    assert!(
        a.state.bytes() == b.state.bytes(),
        "the replicas' states differ"
    );
    let before = a.state.clone();
    a.names(ROOT);
    a.read(3, 0, 10);
    a.op(FileOp::StatFs).unwrap();
    assert!(before == a.state, "a read changed the state");
}

#[test]
fn a_full_state_refuses_the_write_and_keeps_the_rest() {
    let mut fs = Fs::new(1);
    let f = fs.create(ROOT, "big").unwrap();
    let chunk = vec![1u8; IO_BYTES_MAX as usize];
    let mut off = 0;
    let err = loop {
        match fs.op(FileOp::Write {
            ino: f.ino,
            offset: off,
            data: chunk.clone(),
        }) {
            Ok(_) => off += chunk.len() as u64,
            Err(e) => break e,
        }
        assert!(off < 2 << 20, "never full");
    };
    assert_eq!(err, Errno::NoSpace);
    assert_eq!(fs.attr(FileOp::GetAttr { ino: f.ino }).unwrap().size, off);
    fs.op(FileOp::Unlink {
        parent: ROOT,
        name: "big".into(),
    })
    .unwrap();
    fs.create(ROOT, "small").unwrap();
    match fs.op(FileOp::StatFs).unwrap() {
        FileReply::Stats(s) => {
            assert_eq!(s.files, 2);
            // The deleted file's pages are free again, and shown free (`df` after `rm`).
            assert!(
                s.blocks_free * BLOCK >= off * 9 / 10,
                "{} of {} blocks free after deleting {off} bytes",
                s.blocks_free,
                s.blocks
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_state_rolled_back_to_empty_gets_its_tables_again() {
    let mut fs = Fs::new(1);
    let f = fs.create(ROOT, "kept").unwrap();
    fs.write(f.ino, 0, b"x");
    // The library rolls back to a state from before the first write and reloads.
    fs.state = FlatState::new(1 << 20);
    fs.svc.load(&fs.state).unwrap();
    assert_eq!(fs.lookup(ROOT, "kept"), Err(Errno::NoEnt));
    let g = fs.create(ROOT, "new").unwrap();
    assert_eq!(fs.write(g.ino, 0, b"yz").size, 2);
    // And a reload of a state that has them skips nothing it needs.
    fs.svc.load(&fs.state).unwrap();
    assert_eq!(fs.read(g.ino, 0, 10), b"yz");
}
