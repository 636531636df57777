/* The initramfs init of the test bed's QEMU VMs (tests/lab/qemuvm.py builds it with `gcc -static`).
 *
 * Debian's cloud kernel has virtio-pci and virtio-blk as modules and no udev runs this early, so this
 * does what an initramfs-tools image would, and nothing else: load the modules listed (in dependency
 * order) in /modules.list, wait for /dev/vda, mount it as the root file system and hand over to the
 * guest's own init script on it (/sbin/fleetfix-vm-init). Every failure is printed on the serial
 * console, then the machine powers off, so a test sees QEMU exit instead of waiting out its timeout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "fleetfix-vm-initramfs: %s: %s\n", what, strerror(errno));
    sync();
    reboot(RB_POWER_OFF);
    _exit(1);
}

static void load_modules(void) {
    FILE *list = fopen("/modules.list", "r");
    char path[512];
    if (!list) die("open /modules.list");
    while (fgets(path, sizeof path, list)) {
        path[strcspn(path, "\n")] = 0;
        if (!path[0]) continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) die(path);
        if (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST) die(path);
        close(fd);
    }
    fclose(list);
}

int main(void) {
    struct stat info;
    mkdir("/dev", 0755);
    mkdir("/root", 0755);
    if (mount("devtmpfs", "/dev", "devtmpfs", 0, "") != 0 && errno != EBUSY) die("mount /dev");
    load_modules();
    for (int tenths = 0; stat("/dev/vda", &info) != 0; tenths++) {
        if (tenths > 600) die("/dev/vda never appeared");
        usleep(100000);
    }
    if (mount("/dev/vda", "/root", "ext4", 0, "") != 0) die("mount /dev/vda");
    if (mount("/dev", "/root/dev", NULL, MS_MOVE, NULL) != 0) die("move /dev");
    if (chdir("/root") != 0) die("chdir /root");
    if (mount(".", "/", NULL, MS_MOVE, NULL) != 0) die("move the root");
    if (chroot(".") != 0 || chdir("/") != 0) die("chroot");
    char *argv[] = {"/sbin/fleetfix-vm-init", NULL};
    char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", NULL};
    execve(argv[0], argv, envp);
    die("exec /sbin/fleetfix-vm-init");
    return 1;
}
