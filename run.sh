#!/bin/bash
# $1 checkout, $2 port, $3 output
cd $1
python -m inferpool serve /tmp/prof/repo --host 127.0.0.1 --http-port $2 --grpc-port $(($2+1)) --metrics-port $(($2+2)) --workers 2 > /tmp/prof/server-$2.log 2>&1 &
PID=$!
for i in $(seq 100); do curl -sf http://127.0.0.1:$2/v2/health/ready >/dev/null && break; sleep 0.3; done
wrk -t1 -c64 -d14s -s /tmp/prof/post.lua http://127.0.0.1:$2/v2/models/iris-logreg/infer > /tmp/prof/wrk-$2.txt &
sleep 2
py-spy record --pid $PID -d 10 -r 200 --format raw -o $3 --nonblocking > /dev/null 2>&1
wait %2 2>/dev/null; sleep 4
kill -TERM $PID; wait $PID
