# fleetfix's node-side fan-out of `pct exec`: the protocol, and why Perl, are in fleetfix/guests/pctbatch.py.
# argv: BACKSTOP_SECONDS CAP_BYTES INPUT NODE_SCRIPT COMMAND...; stdin: container ids, one per line, until
# EOF. For each id: `pct exec ID -- COMMAND...` with INPUT on its stdin, in a process group of its own
# (killed whole at the backstop); one frame on stdout when it has ended:
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

# Every container reads the same input: an anonymous (already unlinked) temp file, which each child opens
# afresh through /proc so that it gets an offset of its own.
open(my $input_fh, '+>', undef) or die "fleetfix: no temp file for the input: $!\n";
binmode $input_fh;
print {$input_fh} $input and $input_fh->flush or die "fleetfix: writing the input: $!\n";
my $input_path = '/proc/self/fd/' . fileno($input_fh);

my $select = IO::Select->new(\*STDIN);
my %jobs;    # pid -> job
my %pipes;   # fileno -> [job, 'out' | 'err', handle]
my $ids = '';
my $reading = 1;

# A job: `argv` in a process group of its own, `stdin_path` on its stdin; framed as `id` when it has ended.
sub start_job {
    my ($id, $stdin_path, @argv) = @_;
    # `time` is whole seconds (Time::HiRes is not in Debian's perl-base): now is up to 1 s past it, so the
    # deadline gets that second too, or a kill could come before the backstop (seen at 2.03 s of 3).
    my $job = { id => $id, out => '', err => '', dropped => 0, open => 0, deadline => time + $backstop + 1 };
    my ($out_r, $out_w, $err_r, $err_w);
    unless (pipe($out_r, $out_w) && pipe($err_r, $err_w)) {
        return emit({ %$job, status => 126, err => "fleetfix: pipe: $!\n" });
    }
    my $pid = fork;
    if (!defined $pid) {
        return emit({ %$job, status => 126, err => "fleetfix: fork: $!\n" });
    }
    if ($pid == 0) {
        $SIG{PIPE} = 'DEFAULT';  # an ignored signal stays ignored across exec: pipelines in the CT need it
        POSIX::setpgid(0, 0);
        open(STDIN, '<', $stdin_path) && open(STDOUT, '>&', $out_w) && open(STDERR, '>&', $err_w)
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
    for my $handle ($select->can_read($wait)) {
        if (fileno($handle) == fileno(STDIN)) {
            if (sysread(STDIN, $ids, 4096, length $ids)) {
                while ($ids =~ s/\A([^\n]*)\n//) {
                    my $id = $1;
                    if ($id =~ /\A[0-9]+\z/) {
                        start_job($id, $input_path, 'pct', 'exec', $id, '--', @command);
                    } elsif ($id eq 'node' && length $node_script) {
                        start_job(0, '/dev/null', '/bin/sh', '-c', $node_script);
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
        delete $jobs{$job->{pid}};
        emit($job);
    }
}
