//! The seccomp filter every sandboxed command runs under: a classic-BPF program, made here
//! (no libseccomp), that bubblewrap loads with `--seccomp FD` just before it runs the command.
//!
//! It refuses, with `EPERM`, what a command never needs and what would let it reach past its
//! sandbox or into the kernel's less-trodden paths: mounting and unmounting (every mount API),
//! new namespaces and joining others (`unshare`, `setns`, `clone` with any `CLONE_NEW*` flag),
//! `ptrace` and cross-process memory access, the kernel keyrings (`add_key`, `keyctl`,
//! `request_key`), `bpf`, `perf_event_open`, `userfaultfd`, kernel modules, `kexec`, `reboot`,
//! swap and `acct`. `clone3` answers `ENOSYS` (its flags are in memory a filter cannot read;
//! libc then falls back to `clone`, whose flags it can). A program for another architecture
//! than the keeper's (for example i386 or x32 system calls on x86-64) is killed.

/// One classic-BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

// Classic-BPF opcodes (linux/filter.h).
const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS
const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
const JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

// seccomp return values (linux/seccomp.h).
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;

// Offsets in `struct seccomp_data`: nr, arch, instruction_pointer, args[6].
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// The low 32 bits of the first argument (little-endian machines).
const OFF_ARG0_LO: u32 = 16;

/// Every `CLONE_NEW*` flag that `clone` takes (`CLONE_NEWTIME` shares its bit with the exit
/// signal there and is only for `unshare`/`clone3`, both refused whole).
const CLONE_NEW_ANY: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// x32 system calls on x86-64 carry this bit in their number.
#[cfg(target_arch = "x86_64")]
const X32_BIT: Option<u32> = Some(0x4000_0000);
#[cfg(target_arch = "aarch64")]
const X32_BIT: Option<u32> = None;

/// The system calls refused with `EPERM`.
fn refused() -> Vec<libc::c_long> {
    let mut calls = vec![
        // Mounts, every API.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        // Namespaces.
        libc::SYS_unshare,
        libc::SYS_setns,
        // Other processes.
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        // Keyrings.
        libc::SYS_add_key,
        libc::SYS_keyctl,
        libc::SYS_request_key,
        // The kernel's larger surfaces.
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    calls.sort_unstable();
    calls.dedup();
    calls
}

/// Where a jump goes, resolved once the program's length is known.
#[derive(Clone, Copy)]
enum To {
    Next,
    Allow,
    Eperm,
    Enosys,
}

/// The filter, as the bytes of its `struct sock_filter` array (what `bwrap --seccomp` reads).
pub(crate) fn program() -> Vec<u8> {
    // (instruction, where it jumps when true, when false); returns are their own instructions.
    let mut body: Vec<(u16, u32, To, To)> = Vec::new();
    body.push((LD_W_ABS, OFF_NR, To::Next, To::Next));
    if let Some(bit) = X32_BIT {
        body.push((JGE_K, bit, To::Eperm, To::Next));
    }
    for nr in refused() {
        body.push((JEQ_K, nr as u32, To::Eperm, To::Next));
    }
    body.push((JEQ_K, libc::SYS_clone3 as u32, To::Enosys, To::Next));
    body.push((JEQ_K, libc::SYS_clone as u32, To::Next, To::Allow));
    body.push((LD_W_ABS, OFF_ARG0_LO, To::Next, To::Next));
    body.push((JSET_K, CLONE_NEW_ANY, To::Eperm, To::Allow));

    // The architecture check, then the body, then the three returns.
    let mut insns = vec![
        Insn {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: OFF_ARCH,
        },
        Insn {
            code: JEQ_K,
            jt: 1,
            jf: 0,
            k: AUDIT_ARCH,
        },
        Insn {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: RET_KILL_PROCESS,
        },
    ];
    let start = insns.len();
    let allow = start + body.len();
    let (eperm, enosys) = (allow + 1, allow + 2);
    for (i, (code, k, jt, jf)) in body.into_iter().enumerate() {
        let at = start + i;
        let offset = |to: To| {
            let target = match to {
                To::Next => at + 1,
                To::Allow => allow,
                To::Eperm => eperm,
                To::Enosys => enosys,
            };
            u8::try_from(target - at - 1).expect("a filter short enough for 8-bit jumps")
        };
        let (jt, jf) = if code == LD_W_ABS {
            (0, 0)
        } else {
            (offset(jt), offset(jf))
        };
        insns.push(Insn { code, jt, jf, k });
    }
    for k in [
        RET_ALLOW,
        RET_ERRNO | libc::EPERM as u32,
        RET_ERRNO | libc::ENOSYS as u32,
    ] {
        insns.push(Insn {
            code: RET_K,
            jt: 0,
            jf: 0,
            k,
        });
    }
    let mut bytes = Vec::with_capacity(insns.len() * 8);
    for i in insns {
        bytes.extend_from_slice(&i.code.to_ne_bytes());
        bytes.push(i.jt);
        bytes.push(i.jf);
        bytes.extend_from_slice(&i.k.to_ne_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program on one system call (a classic-BPF interpreter for the few opcodes the
    /// generator uses), so the jumps are checked without a kernel.
    fn verdict(program: &[u8], arch: u32, nr: u32, arg0: u32) -> u32 {
        let insns: Vec<Insn> = program
            .chunks(8)
            .map(|c| Insn {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = insns[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    acc = match i.k {
                        OFF_NR => nr,
                        OFF_ARCH => arch,
                        OFF_ARG0_LO => arg0,
                        k => panic!("load of {k}"),
                    }
                }
                RET_K => return i.k,
                code => {
                    let taken = match code {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        JSET_K => acc & i.k != 0,
                        c => panic!("opcode {c:#x}"),
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
            }
        }
    }

    #[test]
    fn refuses_what_it_lists_and_allows_the_rest() {
        let p = program();
        let eperm = RET_ERRNO | libc::EPERM as u32;
        for nr in refused() {
            assert_eq!(verdict(&p, AUDIT_ARCH, nr as u32, 0), eperm, "{nr}");
        }
        for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_execve] {
            assert_eq!(verdict(&p, AUDIT_ARCH, nr as u32, 0), RET_ALLOW);
        }
        let clone = libc::SYS_clone as u32;
        assert_eq!(
            verdict(&p, AUDIT_ARCH, clone, libc::SIGCHLD as u32),
            RET_ALLOW
        );
        assert_eq!(
            verdict(&p, AUDIT_ARCH, clone, libc::CLONE_NEWUSER as u32),
            eperm
        );
        assert_eq!(
            verdict(&p, AUDIT_ARCH, libc::SYS_clone3 as u32, 0),
            RET_ERRNO | libc::ENOSYS as u32
        );
        assert_eq!(verdict(&p, 0x4000_0003, 1, 0), RET_KILL_PROCESS);
    }
}
