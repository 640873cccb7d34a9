package harness

// The auth mode (`--auth`): etcd with auth on, as an operator runs it with users and passwords.
// root owns the ground truth, the writes and compactions made on etcd directly, and
// watchcache's own list and watch (`--etcd-user`); the user "load" (readwrite on every key)
// does everything through the target: watches, Ranges, writes. A quarter of the watch streams
// carry the user "limited" instead, who may read every key but those under /registry/secrets/
// (two grants around it): etcd refuses each of its creates whose range meets that prefix, and
// the checker requires the target to refuse exactly those (record.Run.Denied). Tokens are
// etcd's simple tokens, as clientv3 gets them: raw streams authenticate once per stream,
// through the target, and send the token in the stream's metadata.

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"watchcache.local/tools/robustness/record"
)

// errPermissionDenied is etcd's refusal of a create whose range the user may not read.
const errPermissionDenied = "etcdserver: permission denied"

// Creds are an etcd user's name and password (nil: auth off).
type Creds struct{ User, Password string }

var (
	rootCreds    = &Creds{"root", "rootpw"}
	loadCreds    = &Creds{"load", "loadpw"}
	limitedCreds = &Creds{"limited", "limitedpw"}
)

// limitedDenied is what the user limited may not read: the secrets.
var limitedDenied = record.Denied{User: limitedCreds.User, Key: "/registry/secrets/", End: prefixEnd("/registry/secrets/")}

// slotCreds are the credentials a watch slot (raw or clientv3) uses through the target: a
// quarter of them the user limited's (nil: auth off).
func (l *load) slotCreds(id int) *Creds {
	if l.tgtCreds != nil && id%4 == 3 {
		return limitedCreds
	}
	return l.tgtCreds
}

// enableAuth adds root and load and turns etcd's auth on.
func enableAuth(endpoint string) error {
	cli, err := newClient([]string{endpoint}, false, nil)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, rootCreds.User, rootCreds.Password); return err },
		func() error { _, err := cli.UserGrantRole(ctx, rootCreds.User, "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "load"); return err },
		// [\0, \0): every key (etcd's "from key" range).
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "load", "\x00", "\x00", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, loadCreds.User, loadCreds.Password); return err },
		func() error { _, err := cli.UserGrantRole(ctx, loadCreds.User, "load"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "limited"); return err },
		// Every key below the secrets, and every key from their prefix's end.
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "limited", "\x00", limitedDenied.Key, clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "limited", limitedDenied.End, "\x00", clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, limitedCreds.User, limitedCreds.Password); return err },
		func() error { _, err := cli.UserGrantRole(ctx, limitedCreds.User, "limited"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("turning auth on (step %d): %w", i+1, err)
		}
	}
	return nil
}

// withToken authenticates c over conn and returns ctx carrying the token as clientv3 sends it
// (ctx itself when c is nil).
func withToken(ctx context.Context, conn *grpc.ClientConn, c *Creds) (context.Context, error) {
	if c == nil {
		return ctx, nil
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := pb.NewAuthClient(conn).Authenticate(actx, &pb.AuthenticateRequest{Name: c.User, Password: c.Password})
	if err != nil {
		return nil, fmt.Errorf("authenticate %s: %w", c.User, err)
	}
	return metadata.AppendToOutgoingContext(ctx, "token", r.Token), nil
}
