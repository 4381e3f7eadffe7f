package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRedact(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"postgres URL", "postgres://user:secret@host:5432/db?sslmode=disable", "postgres://user:xxxxx@host:5432/db?sslmode=disable"},
		{"postgresql scheme", "postgresql://user:secret@host/db", "postgresql://user:xxxxx@host/db"},
		{"user without password", "postgres://user@host/db", "postgres://user@host/db"},
		{"no user", "postgres://host/db", "postgres://host/db"},
		{"password with @", "postgres://user:p@ss@host/db", "postgres://user:xxxxx@host/db"},
		{"password with / and ?", "postgres://user:a/b?c@host/db", "postgres://user:xxxxx@host/db"},
		{"password with ://", "postgres://user:x://y@host/db", "postgres://user:xxxxx@host/db"},
		{"empty password", "postgres://user:@host/db", "postgres://user:xxxxx@host/db"},
		{"password in query", "postgres://user@host/db?sslmode=require&password=secret&x=1", "postgres://user@host/db?sslmode=require&password=xxxxx&x=1"},
		{"sslpassword in query", "postgres://host/db?SSLPassword=secret", "postgres://host/db?SSLPassword=xxxxx"},
		{"@ in the query only", "postgres://host/db?application_name=a@b", "postgres://host/db?application_name=a@b"},
		{"key=value DSN", "host=db user=u password=secret dbname=shop", "host=db user=u password=xxxxx dbname=shop"},
		{"key=value DSN, quoted", `host=db password='se cret\'s' dbname=shop`, "host=db password=xxxxx dbname=shop"},
		{"key=value DSN, spaces around =", "password = secret host=db", "password = xxxxx host=db"},
		{"key=value DSN, upper case", "HOST=db PASSWORD=secret", "HOST=db PASSWORD=xxxxx"},
		{"key=value DSN, sslpassword", "host=db sslpassword=secret", "host=db sslpassword=xxxxx"},
		{"key=value DSN, password last", "host=db password=secret", "host=db password=xxxxx"},
		{"key=value DSN, password value with ://", "password=a://b host=db", "password=xxxxx host=db"},
		{"key=value DSN without password", "host=db user=u", "host=db user=u"},
		{"similar key left alone", "host=db mypassword=x", "host=db mypassword=x"},
		{"nats user and password", "nats://bridge:secret@nats:4222", "nats://bridge:xxxxx@nats:4222"},
		{"nats token", "nats://s3cr3ttoken@nats:4222", "nats://xxxxx@nats:4222"},
		{"tls token", "tls://tok@nats:4222", "tls://xxxxx@nats:4222"},
		{"nats without credentials", "nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats list", "nats://a:p1@n1:4222,nats://b:p2@n2:4222,nats://n3:4222", "nats://a:xxxxx@n1:4222,nats://b:xxxxx@n2:4222,nats://n3:4222"},
		{"nats list with spaces", "nats://a:p1@n1:4222, nats://tok@n2:4222", "nats://a:xxxxx@n1:4222, nats://xxxxx@n2:4222"},
		{"leading space", "  postgres://u:p@h/db", "  postgres://u:xxxxx@h/db"},
		{"empty", "", ""},
		{"plain text", "just a message", "just a message"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Redact(tt.in))
		})
	}
}
