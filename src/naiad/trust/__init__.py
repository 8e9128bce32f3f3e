"""The trust boundary of the samples and token paths: every path, listing, kept index and decode
bound that data chooses passes through here (docs/SECURITY.md).

NOTE [ Trust boundary ]
naiad trusts the user's code and its own processes; it does not trust the files it reads, the
kept indexes and listings it finds, or the servers it talks to. What such data may make naiad
do is decided in this package alone, so that each promise of docs/SECURITY.md is enforced in one
place:

* ``paths``: which file a path inside a table may name (its table's own location or the roots
  the user names, never a local file from a remote table), the bytes such a file may weigh, how
  a local file is opened (regular files only: a FIFO would block the read forever), names kept
  as bytes and given back as ``str`` with surrogate escapes, and the folder walk that visits
  each directory once.
* ``kept``: the files naiad keeps between processes (block indexes, member indexes, folder
  listings): read only when they are this user's (or an owner the user names), bounded in
  size, parsed without pickle and without allocating more than they weigh; a refusal or an
  implausible entry is rebuilt, with the reason logged.
* ``listings``: what a folder's listing may say before it names a sample: a kept listing's arrays
  (names inside their class folders, labels within the classes), and a server's listing of a
  prefix (plain keys under the prefix, byte counts for sizes), refused with the name otherwise.
* ``bounds``: what a decode may allocate (an image's pixels and its resize's, an audio clip's
  samples), checked against the header before any allocation.
"""
