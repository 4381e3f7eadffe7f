package pgrepl

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDSNParam(t *testing.T) {
	for _, tt := range []struct{ dsn, key, want string }{
		{"postgres://u:p@h/db?sslmode=verify-full&sslrootcert=/etc/ca.crt", "sslrootcert", "/etc/ca.crt"},
		{"postgresql://u@h/db?sslrootcert=%2Fa%20b%2Fca.crt", "sslrootcert", "/a b/ca.crt"},
		{"postgres://u@h/db?sslmode=require", "sslrootcert", ""},
		{"host=h sslrootcert=/etc/ca.crt sslmode=verify-full", "sslrootcert", "/etc/ca.crt"},
		{"host=h sslrootcert = '/a b/c\\'a.crt' sslmode=verify-full", "sslrootcert", "/a b/c'a.crt"},
		{"host=h password='x sslrootcert=/evil' sslmode=verify-full", "sslrootcert", ""},
		{"sslmode=require sslmode=verify-ca", "sslmode", "verify-ca"},
		{"host=h sslcert=/a\\ b.crt", "sslcert", "/a b.crt"},
		{"", "sslmode", ""},
	} {
		assert.Equal(t, tt.want, dsnParam(tt.dsn, tt.key), "%s in %s", tt.key, tt.dsn)
	}
}
