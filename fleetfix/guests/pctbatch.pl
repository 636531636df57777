# fleetfix's node-side fan-out of `pct exec`: the protocol, and why Perl, are in fleetfix/guests/pctbatch.py.
# argv: BACKSTOP_SECONDS CAP_BYTES INPUT NODE_SCRIPT COMMAND...; stdin: container ids, one per line, until
# EOF. For each id: `pct exec ID -- COMMAND...` with INPUT on its stdin, through a pipe of its own, in a
# process group of its own (killed whole at the backstop); one frame on stdout when it has ended:
#   fleetfix-batch ID EXIT OUTLEN ERRLEN DROPPED\n<stdout><stderr>
# The line `node` instead of an id: `/bin/sh -c NODE_SCRIPT` on the node itself, framed as ID 0.
use strict;
use warnings;
use IO::Handle ();
use IO::Select ();
use POSIX ();

my ($backstop, $cap, $input, $node_script, @command) = @ARGV;
my $straggler_grace = 5;  # seconds the output pipes may stay open after pct has ended
$SIG{PIPE} = 'IGNORE';    # a channel closed under us shows as a failed write

# Each container reads INPUT from a pipe of its own, fed from here. Never one file for all of them: root in
# a privileged container reopens its command's stdin through /proc/PID/fd/0 for writing, and a shared file
# would carry what it wrote to every container started after it. A pipe reopened that way is still only
# that container's own.
my $select = IO::Select->new(\*STDIN);
my $feeding = IO::Select->new;  # the input pipes with bytes still to go
my %jobs;    # pid -> job
my %pipes;   # fileno -> [job, 'out' | 'err', handle]
my %feeds;   # fileno -> job, for the pipes in $feeding
my $ids = '';
my $reading = 1;

# A job: `argv` in a process group of its own, INPUT on its stdin (`with_input`, else /dev/null); framed as
# `id` when it has ended.
sub start_job {
    my ($id, $with_input, @argv) = @_;
    # `time` is whole seconds (Time::HiRes is not in Debian's perl-base): now is up to 1 s past it, so the
    # deadline gets that second too, or a kill could come before the backstop (seen at 2.03 s of 3).
    my $job = { id => $id, out => '', err => '', dropped => 0, open => 0, deadline => time + $backstop + 1 };
    my ($out_r, $out_w, $err_r, $err_w, $in_r, $in_w);
    unless (pipe($out_r, $out_w) && pipe($err_r, $err_w) && (!$with_input || pipe($in_r, $in_w))) {
        return emit({ %$job, status => 126, err => "fleetfix: pipe: $!\n" });
    }
    my $pid = fork;
    if (!defined $pid) {
        return emit({ %$job, status => 126, err => "fleetfix: fork: $!\n" });
    }
    if ($pid == 0) {
        $SIG{PIPE} = 'DEFAULT';  # an ignored signal stays ignored across exec: pipelines in the CT need it
        POSIX::setpgid(0, 0);
        # Only fds 0-2 cross the exec: Perl opens every other handle close-on-exec ($^F), so no container
        # holds another's pipes.
        ($with_input ? open(STDIN, '<&', $in_r) : open(STDIN, '<', '/dev/null'))
            && open(STDOUT, '>&', $out_w) && open(STDERR, '>&', $err_w)
            or POSIX::_exit(126);
        # Not found: said as a shell would, which guests/lxc.container_error knows.
        exec { $argv[0] } @argv
            or print STDERR "$argv[0]: ", ($!{ENOENT} ? 'command not found' : $!), "\n";
        POSIX::_exit(127);
    }
    close $out_w;
    close $err_w;
    $job->{pid} = $pid;
    $jobs{$pid} = $job;
    for ([$out_r, 'out'], [$err_r, 'err']) {
        my ($handle, $part) = @$_;
        $pipes{fileno $handle} = [$job, $part, $handle];
        $select->add($handle);
        $job->{open}++;
    }
    if ($with_input) {
        close $in_r;
        $in_w->blocking(0);  # a container that reads slowly or never must not hold up the others
        @$job{'in', 'sent'} = ($in_w, 0);
        feed($job);  # most inputs fit in the pipe at once: no turn of the loop for them
        if ($job->{in}) {
            $feeds{fileno $in_w} = $job;
            $feeding->add($in_w);
        }
    }
}

# As much of INPUT as the job's pipe takes now; at the end, or when the job cannot take more (it has exited
# or closed its stdin: EPIPE), the pipe is closed.
sub feed {
    my ($job) = @_;
    while ($job->{sent} < length $input) {
        my $written = syswrite($job->{in}, $input, length($input) - $job->{sent}, $job->{sent});
        if (!defined $written) {
            return if $!{EAGAIN};  # the pipe is full: on when it has room
            last;
        }
        $job->{sent} += $written;
    }
    stop_feeding($job);
}

sub stop_feeding {
    my ($job) = @_;
    my $handle = delete $job->{in} or return;
    if (delete $feeds{fileno $handle}) {
        $feeding->remove($handle);
    }
    close $handle;
}

sub close_pipe {
    my ($fd) = @_;
    my ($job, undef, $handle) = @{ delete $pipes{$fd} };
    $select->remove($handle);
    close $handle;
    $job->{open}--;
}

sub emit {
    my ($job) = @_;
    my $frame = sprintf("fleetfix-batch %d %d %d %d %d\n", $job->{id}, $job->{status}, length $job->{out},
                        length $job->{err}, $job->{dropped}) . $job->{out} . $job->{err};
    while (length $frame) {
        my $written = syswrite(STDOUT, $frame);
        exit 0 unless $written;  # the controller is gone: the containers' own watchdogs end their commands
        substr($frame, 0, $written) = '';
    }
}

while ($reading || %jobs) {
    # Output closed but not yet reaped: the exit is a moment away, so look again soon.
    my $wait = (grep { !$_->{open} && !defined $_->{status} } values %jobs) ? 0.01 : 1;
    my ($readable, $writable) = IO::Select->select($select, $feeding->count ? $feeding : undef, undef, $wait);
    feed($feeds{fileno $_}) for @{ $writable || [] };
    for my $handle (@{ $readable || [] }) {
        if (fileno($handle) == fileno(STDIN)) {
            if (sysread(STDIN, $ids, 4096, length $ids)) {
                while ($ids =~ s/\A([^\n]*)\n//) {
                    my $id = $1;
                    if ($id =~ /\A[0-9]+\z/) {
                        start_job($id, 1, 'pct', 'exec', $id, '--', @command);
                    } elsif ($id eq 'node' && length $node_script) {
                        start_job(0, 0, '/bin/sh', '-c', $node_script);
                    }
                }
            } else {  # EOF: no more ids; the jobs in flight still end and report
                $select->remove(\*STDIN);
                $reading = 0;
            }
            next;
        }
        my $fd = fileno $handle;
        my ($job, $part) = @{ $pipes{$fd} };
        my $got = sysread($handle, my $chunk, 65536);
        if (!$got) {
            close_pipe($fd);
            next;
        }
        my $room = $cap - length $job->{$part};
        $job->{$part} .= substr($chunk, 0, $room) if $room > 0;
        $job->{dropped} += $got - $room if $got > $room;
    }
    while ((my $pid = waitpid(-1, POSIX::WNOHANG())) > 0) {
        my $job = $jobs{$pid} or next;
        $job->{status} = POSIX::WIFSIGNALED($?) ? 128 + POSIX::WTERMSIG($?) : POSIX::WEXITSTATUS($?);
        $job->{ended} = time;
    }
    my $now = time;
    for my $job (values %jobs) {
        if (!defined $job->{status} && !$job->{killed} && $now >= $job->{deadline}) {
            kill 'KILL', -$job->{pid};  # pct and what it started, as the one-channel backstop does
            $job->{killed} = 1;
        }
        next unless defined $job->{status};
        if ($job->{open} && $now - $job->{ended} >= $straggler_grace) {  # held open by what left the group
            close_pipe($_) for grep { $pipes{$_}[0] == $job } keys %pipes;
        }
        next if $job->{open};
        stop_feeding($job);  # it ended without reading all of its input (or something it left holds it)
        delete $jobs{$job->{pid}};
        emit($job);
    }
}
