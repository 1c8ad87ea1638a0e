#!/usr/bin/env python3
# Floor: every non-hole byte of the image read once, cold, O_DIRECT,
# 4 MiB requests, 8 in flight (as the tune's data reader does).
import os,sys,time,mmap,threading
p=sys.argv[1]
f=os.open(p,os.O_RDONLY); os.posix_fadvise(f,0,0,os.POSIX_FADV_DONTNEED)
fd=os.open(p,os.O_RDONLY|os.O_DIRECT)
size=os.fstat(f).st_size
reqs=[]; off=0
while off<size:
    try: d=os.lseek(f,off,os.SEEK_DATA)
    except OSError: break
    h=os.lseek(f,d,os.SEEK_HOLE); d-=d%4096
    o=d
    while o<h:
        n=min(4<<20,h-o); n=(n+4095)//4096*4096; reqs.append((o,n)); o+=n
    off=h
lock=threading.Lock(); total=[0]
def work():
    buf=mmap.mmap(-1,4<<20)
    while True:
        with lock:
            if not reqs: return
            o,n=reqs.pop(0)
        r=os.preadv(fd,[memoryview(buf)[:n]],o); 
        with lock: total[0]+=r
t=time.time()
ts=[threading.Thread(target=work) for _ in range(8)]
[x.start() for x in ts]; [x.join() for x in ts]
print(f"floor (direct, 8 in flight): {total[0]/2**20:.0f} MiB in {time.time()-t:.2f} s")
