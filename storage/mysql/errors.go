package mysql

// Server errors, translated once: which are worth a retry, which are the
// input's fault (a 4xx), and the numbers the storage acts on.

import (
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/storage"
)

// MySQL/MariaDB error numbers the storage acts on.
const (
	errDupEntry        = 1062
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
	errServerShutdown  = 1053
	errConnKilled      = 1927 // MariaDB: "Connection was killed"
	errQueryKilled     = 1317 // the statement was interrupted by KILL
)

// retryReason says whether err is worth running the transaction again for,
// and why: "deadlock", "lock_wait_timeout", "connection", or "" for no.
func retryReason(err error) string {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case errDeadlock:
			return "deadlock"
		case errLockWaitTimeout:
			return "lock_wait_timeout"
		case errConnKilled, errServerShutdown, errQueryKilled:
			return "connection"
		}
		return ""
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, errAttemptTimedOut) {
		return "connection"
	}
	return ""
}

// Server errors that say a value was refused: the input is at fault, and
// no retry (and no "storage unavailable") will change that.
var dataErrors = map[uint16]bool{
	1048: true, // column cannot be null
	1264: true, // out of range value
	1265: true, // data truncated
	1292: true, // incorrect datetime (or other) value
	1366: true, // incorrect string value
	1367: true, // illegal value
	1406: true, // data too long for column
	1690: true, // value out of range
}

const errPacketTooLarge = 1153

// dataError turns a refused value into the domain error the caller maps to
// a 4xx, keeping the server's one-line reason; other errors pass through.
func dataError(err error) error {
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mysql.ErrPktTooLarge), errors.As(err, &me) && me.Number == errPacketTooLarge:
		return storage.Errorf(storage.ETooLarge, "the statement is larger than the server's max_allowed_packet: %v", err)
	case errors.As(err, &me) && dataErrors[me.Number]:
		return storage.Errorf(storage.EInvalid, "value refused by the database: %s", me.Message)
	}
	return err
}

// mysqlErrNo returns the server error number in err's chain, or 0.
func mysqlErrNo(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}
