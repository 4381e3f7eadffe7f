package natsembed_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/natsembed"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	return fi.Mode().Perm()
}

// TestDataDirMode: a missing data_dir is made 0700, parents included; an
// existing one others may enter is left alone with a warning that says
// how to close it.
func TestDataDirMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "data")
	warn, err := natsembed.PrepareDataDir(dir)
	require.NoError(t, err)
	require.Empty(t, warn)
	require.Equal(t, os.FileMode(0o700), mode(t, dir))
	require.Equal(t, os.FileMode(0o700), mode(t, filepath.Dir(dir)))

	open := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, os.Chmod(open, 0o755))
	warn, err = natsembed.PrepareDataDir(open)
	require.NoError(t, err)
	require.Equal(t, "data_dir "+open+" has mode 0755: other users of this machine may enter it (the embedded server's store and key in it stay the bridge user's own); chmod 700 "+open, warn)
	require.Equal(t, os.FileMode(0o755), mode(t, open), "left as it is")

	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err = natsembed.PrepareDataDir(file)
	require.EqualError(t, err, "data_dir "+file+" is not a directory")
}

// TestUserKey: the key is made once (0600) and kept across starts; one
// that others could read, that is a link, or holds no user seed is
// replaced, saying why.
func TestUserKey(t *testing.T) {
	dir := t.TempDir()
	path, pub, replaced, err := natsembed.UserKey(dir)
	require.NoError(t, err)
	require.Empty(t, replaced)
	require.Equal(t, filepath.Join(dir, natsembed.KeyFile), path)
	require.Equal(t, os.FileMode(0o600), mode(t, path))
	require.Equal(t, byte('U'), pub[0], "a user key")

	again, pub2, replaced, err := natsembed.UserKey(dir)
	require.NoError(t, err)
	require.Equal(t, path, again)
	require.Equal(t, pub, pub2, "the same key at every start")
	require.Empty(t, replaced)

	require.NoError(t, os.Chmod(path, 0o644))
	_, pub3, replaced, err := natsembed.UserKey(dir)
	require.NoError(t, err)
	require.Equal(t, "its mode was 0644: others could read it", replaced)
	require.NotEqual(t, pub, pub3)
	require.Equal(t, os.FileMode(0o600), mode(t, path))

	require.NoError(t, os.Remove(path))
	planted := filepath.Join(t.TempDir(), "planted")
	require.NoError(t, os.WriteFile(planted, []byte("x"), 0o600))
	require.NoError(t, os.Symlink(planted, path))
	_, _, replaced, err = natsembed.UserKey(dir)
	require.NoError(t, err)
	require.Equal(t, "it was not a regular file", replaced)
	b, err := os.ReadFile(planted)
	require.NoError(t, err)
	require.Equal(t, "x", string(b), "the link is replaced, its target never written")

	require.NoError(t, os.WriteFile(path, []byte("SAAGARBAGE\n"), 0o600))
	_, _, replaced, err = natsembed.UserKey(dir)
	require.NoError(t, err)
	require.Equal(t, "it held no nkey seed", replaced)

	if os.Geteuid() == 0 { // only root can give a file away
		require.NoError(t, os.Chown(path, 65534, 65534))
		_, _, replaced, err = natsembed.UserKey(dir)
		require.NoError(t, err)
		require.Equal(t, "it belonged to another user", replaced)
	}

	key, err := natsembed.ClientKey(dir)
	require.NoError(t, err)
	require.Equal(t, path, key)
	key, err = natsembed.ClientKey(t.TempDir())
	require.NoError(t, err)
	require.Empty(t, key, "no key: a server from before keys, which admits anyone")
}

// TestUserNKeyServer: a server with UserNKey refuses a client without the
// key and serves one that signs with it, JetStream included.
func TestUserNKeyServer(t *testing.T) {
	dir := t.TempDir()
	path, pub, _, err := natsembed.UserKey(dir)
	require.NoError(t, err)
	srv := natsembed.StartT(t, natsembed.Options{Port: -1, UserNKey: pub})

	_, err = nats.Connect(srv.URL())
	require.ErrorIs(t, err, nats.ErrAuthorization, "a client without the key is refused")

	key, err := nats.NkeyOptionFromSeed(path)
	require.NoError(t, err)
	nc, err := nats.Connect(srv.URL(), key)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "b"})
	require.NoError(t, err)

	other, _, _, err := natsembed.UserKey(t.TempDir())
	require.NoError(t, err)
	wrong, err := nats.NkeyOptionFromSeed(other)
	require.NoError(t, err)
	_, err = nats.Connect(srv.URL(), wrong)
	require.ErrorIs(t, err, nats.ErrAuthorization, "another key is refused")
}

// TestWriteAddrModes: the address file is the bridge user's only, in a
// data_dir made 0700.
func TestWriteAddrModes(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{Port: -1})
	dir := filepath.Join(t.TempDir(), "data")
	drop, err := natsembed.WriteAddr(dir, srv)
	require.NoError(t, err)
	defer drop()
	require.Equal(t, os.FileMode(0o700), mode(t, dir))
	require.Equal(t, os.FileMode(0o600), mode(t, filepath.Join(dir, natsembed.AddrFile)))
}
