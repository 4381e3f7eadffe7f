package natsembed

import (
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Operator is an operator-mode setup (decentralized JWT authentication) for
// tests: an operator, its system account and accounts, all signed in
// memory with nkeys and jwt, as nsc would. Start a server with it in
// Options.Operator; clients connect with the creds of an account's users.
type Operator struct {
	kp     nkeys.KeyPair
	claims *jwt.OperatorClaims
	sys    *Account
	accts  []*Account
}

// Account is an account of an Operator.
type Account struct {
	Name string
	// Public is the account's public nkey.
	Public string
	kp     nkeys.KeyPair
	jwt    string
}

// NewOperator makes an operator named name with a system account.
func NewOperator(name string) (*Operator, error) {
	kp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	o := &Operator{kp: kp, claims: jwt.NewOperatorClaims(pub)}
	o.claims.Name = name
	if o.sys, err = o.NewAccount("SYS", false); err != nil {
		return nil, err
	}
	o.claims.SystemAccount = o.sys.Public
	return o, nil
}

// NewAccount makes an account of o, with unlimited JetStream when
// jetstream is true.
func (o *Operator) NewAccount(name string, jetstream bool) (*Account, error) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if jetstream {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	}
	tok, err := ac.Encode(o.kp)
	if err != nil {
		return nil, fmt.Errorf("signing account %s: %w", name, err)
	}
	a := &Account{Name: name, Public: pub, kp: kp, jwt: tok}
	o.accts = append(o.accts, a)
	return a, nil
}

// Creds returns the content of a .creds file for a new user of a named
// name with permissions perms (all allowed when zero), expiring at expires
// (never when zero).
func (a *Account) Creds(name string, perms jwt.Permissions, expires time.Time) ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.Permissions = perms
	if !expires.IsZero() {
		uc.Expires = expires.Unix()
	}
	tok, err := uc.Encode(a.kp)
	if err != nil {
		return nil, fmt.Errorf("signing user %s: %w", name, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(tok, seed)
}

// configure sets so to trust o and resolve its accounts from memory.
func (o *Operator) configure(so *server.Options) error {
	tok, err := o.claims.Encode(o.kp)
	if err != nil {
		return fmt.Errorf("signing operator: %w", err)
	}
	claims, err := jwt.DecodeOperatorClaims(tok)
	if err != nil {
		return err
	}
	res := &server.MemAccResolver{}
	for _, a := range o.accts {
		if err := res.Store(a.Public, a.jwt); err != nil {
			return err
		}
	}
	so.TrustedOperators = []*jwt.OperatorClaims{claims}
	so.AccountResolver = res
	so.SystemAccount = o.sys.Public
	return nil
}
