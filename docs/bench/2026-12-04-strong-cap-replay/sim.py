import json, sys
from pathlib import Path
qs=[json.loads(l) for l in open(str(Path(__file__).resolve().parent.parent / '2026-12-03-tree-verify' / 'questions.jsonl'))]
pts={1:0.2899,4:0.2616,8:0.308,10:0.3111,12:0.3236,14:0.3629,15:0.3804,16:0.3838,17:0.398}
ks=sorted(pts)
def cost(w):
    if w in pts: return pts[w]
    for a,b in zip(ks,ks[1:]):
        if a<w<b: return pts[a]+(pts[b]-pts[a])*(w-a)/(b-a)
    return pts[17]
def match(c,t):
    n=0
    while n<len(c) and n<len(t) and c[n]==t[n]: n+=1
    return n
def cut(toks,confs,cap,least):
    out=[]
    for t,c in zip(toks,confs):
        out.append(t)
        if len(out)>=cap or c<least: break
    return out
STEP_D=0.045
def replay(q, scap, wcap=7, dcap=7, least=0.7, drafter=True):
    a_=q['answer']; rows=q['rows']; join=q['join']
    i=1; passes=0; sec=0.0; nd=0
    while i<len(a_):
        r=rows[i-1]; truth=a_[i:]; room=len(a_)-i-1
        strong=r['ng_n']>=3
        ng=r['ng'][: scap if strong else wcap][:max(room,0)]
        dr=[]
        if not ng and drafter and join is not None and i>=join:
            dr=cut(r['dr'],r['conf'],dcap,least)[:max(room,0)]
        c=ng or dr
        a=match(c,truth)
        sec+=cost(1+len(c))+STEP_D*len(dr); nd+=len(dr); passes+=1
        i+=a+1
    return passes, sec, nd
for scap in (7,9,11,12,13,16):
    tot=[replay(q,scap) for q in qs]
    print('scap',scap,'passes',sum(t[0] for t in tot),'s %.2f'%sum(t[1] for t in tot),'dsteps',sum(t[2] for t in tot))
for dcap in (3,5,7):
  for least in (0.5,0.7,0.9):
    tot=[replay(q,11,dcap=dcap,least=least) for q in qs]
    print('dcap',dcap,least,'passes',sum(t[0] for t in tot),'s %.2f'%sum(t[1] for t in tot))
tot=[replay(q,16,drafter=False) for q in qs]; print('no drafter', sum(t[0] for t in tot),'%.2f'%sum(t[1] for t in tot))
# HF lookup shape approx: ngram up to 10 any match
tot=[replay(q,10,wcap=10,drafter=False) for q in qs]; print('lookup-ish', sum(t[0] for t in tot),'%.2f'%sum(t[1] for t in tot))
