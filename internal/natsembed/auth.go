package natsembed

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// KeyFile is the file, in the bridge's data_dir, that holds the nkey seed
// of the embedded server's user (mode 0600): `bridge run` makes it, the
// server admits only clients that sign its challenge with it (the bridge's
// own connections, its helper commands, `nats --nkey <data_dir>/KeyFile`),
// so no other user or process of the machine reaches the changes, the
// checkpoints or the control plane. Unlike a password or a token, the seed
// never crosses the connection: a process squatting the port while the
// bridge is down learns nothing from a helper command that dials it.
const KeyFile = "embedded-nats.nk"

// PrepareDataDir makes sure dir, the bridge's data_dir, exists: a missing
// one is created with mode 0700 (its parents too). An existing one is left
// as it is (it may be a volume or a directory an administrator set up);
// warning is then non-empty, with the fix, when other users of the machine
// may enter it. The files the bridge keeps there are its user's only
// either way (0600 and 0700).
func PrepareDataDir(dir string) (warning string, err error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", fmt.Errorf("creating data_dir %s: %w", dir, err)
		}
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading data_dir %s: %w", dir, err)
	case !fi.IsDir():
		return "", fmt.Errorf("data_dir %s is not a directory", dir)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return fmt.Sprintf("data_dir %s has mode %04o: other users of this machine may enter it (the embedded server's store and key in it stay the bridge user's own); chmod 700 %s", dir, m, dir), nil
	}
	return "", nil
}

// UserKey returns the path of dir's KeyFile and its public user key,
// making a new key (mode 0600) when there is none. A key it cannot trust is
// replaced, and replaced says why: a file that is not a regular file owned
// by this process's user, that others could read (so may have), or that
// holds no user seed. The same key serves every start, so that nats CLI
// contexts naming the file keep working.
func UserKey(dir string) (path, pub, replaced string, err error) {
	path = filepath.Join(dir, KeyFile)
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return "", "", "", fmt.Errorf("reading the embedded server's key %s: %w", path, err)
	case !fi.Mode().IsRegular():
		replaced = "it was not a regular file"
	case !ownedByMe(fi):
		replaced = "it belonged to another user"
	case fi.Mode().Perm()&0o077 != 0:
		replaced = fmt.Sprintf("its mode was %04o: others could read it", fi.Mode().Perm())
	default:
		if pub, err = readUserKey(path); err == nil {
			return path, pub, "", nil
		}
		replaced = err.Error()
	}
	pub, err = newUserKey(dir, path)
	if err != nil {
		return "", "", "", err
	}
	return path, pub, replaced, nil
}

// readUserKey returns the public key of the user seed in path.
func readUserKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	defer clear(b)
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return "", errors.New("it held no nkey seed")
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", errors.New("it held no user seed")
	}
	return pub, nil
}

// newUserKey writes a new user seed to path, through a temporary file of
// mode 0600 renamed over it (so a file or link there is replaced, never
// written through), and returns its public key.
func newUserKey(dir, path string) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("making the embedded server's key: %w", err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("making the embedded server's key: %w", err)
	}
	defer clear(seed)
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("making the embedded server's key: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+KeyFile+"-*") // mode 0600
	if err != nil {
		return "", fmt.Errorf("writing the embedded server's key in %s: %w", dir, err)
	}
	tmp := f.Name()
	_, err = f.Write(append(seed, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("writing the embedded server's key %s: %w", path, err)
	}
	return pub, nil
}

// ClientKey returns the key file a helper command (status, snapshot,
// pause, serve...) authenticates to the embedded server of the bridge
// whose data_dir is dir with: "" when there is none (a bridge of a version
// before the key, which admits anyone). A key this user cannot read is an
// error saying whom to run the command as.
func ClientKey(dir string) (string, error) {
	path := filepath.Join(dir, KeyFile)
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	case errors.Is(err, fs.ErrPermission):
		return "", fmt.Errorf("the embedded NATS server admits only holders of its key %s, which this user (uid %d) cannot read: run the command as the user `bridge run` runs as", path, os.Geteuid())
	case err != nil:
		return "", fmt.Errorf("reading the embedded NATS server's key %s: %w", path, err)
	}
	_ = f.Close()
	return path, nil
}
